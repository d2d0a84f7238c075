"""A step that raises fails only the requests that fail on their own."""

from __future__ import annotations

from collections.abc import Callable

from engine.block_manager import RELEASED, BlockManager
from engine.model_runner import StepLogits
from engine.outputs import RequestOutput
from engine.scheduled_batch import ScheduledBatch
from engine.scheduler import Scheduler
from engine.sequence import Sequence


class StepFaults:
    """Runs a step through ``run``; if it raises, reruns its requests one by one, so only a
    request whose own step fails is failed (``fail`` turns it into an error output) and the rest
    go on. Blocks published in a failed step may carry keys of tokens never written: they are
    forgotten, and a sequence that mapped a failed request's blocks this step is preempted to
    recompute them."""

    def __init__(
        self, run: Callable[[ScheduledBatch], StepLogits], scheduler: Scheduler, block_manager: BlockManager,
        fail: Callable[[Sequence, Exception, list[RequestOutput]], None],
    ) -> None:
        self._run, self._scheduler, self._blocks, self._fail = run, scheduler, block_manager, fail

    def execute(self, batch: ScheduledBatch, finished: list[RequestOutput]) -> StepLogits:
        try:
            return self._run(batch)
        except Exception as batch_error:
            if getattr(batch_error, "fatal", False):  # the engine itself broke (a tensor-parallel rank)
                raise
            self._blocks.forget_sequences(batch.seqs)
            if len(batch) == 1:
                self._fail(batch.seqs[0], batch_error, finished)
                return StepLogits()
        parts = []
        poisoned: set[int] = set()  # blocks of failed requests: their keys were never written
        for item in batch.items:
            seq = item.seq
            if seq.is_finished:
                continue  # a sample of a request that failed earlier in this loop
            if poisoned.intersection(seq.block_table):
                self._scheduler.preempt(seq)  # it mapped a failed request's prefix this step: recompute
                continue
            try:
                alone = ScheduledBatch.of(batch.step, [item], wants_prompt_logits=batch.wants_prompt_logits,
                                          wants_hidden=batch.wants_hidden)
                parts.append(self._run(alone))
            except Exception as error:
                poisoned.update(b for b in seq.block_table if b != RELEASED)
                self._blocks.forget_blocks(seq.block_table)
                self._fail(seq, error, finished)
        return StepLogits.merge(parts)
