"""The *run* of a step: the forward pass of a scheduled batch, now or overlapped.

With async scheduling, step t+1 is launched while step t is still on the device: sequences
that sampled in step t carry a placeholder as their last token, the scheduler gives each its
next position and the runner fills the placeholder from step t's tokens on the device. The
host waits for step t's tokens only after t+1 is launched, so stop conditions see real tokens:
a sequence that stops at t has one wasted position in t+1, whose token is dropped. A step that
needs host state per token (grammars, logprobs, prompt logprobs, forks, beams) or a fault hook
runs now, after step t's tokens are applied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from engine.beam_requests import BeamRequests
from engine.block_manager import BlockManager
from engine.model_runner import InFlightStep, ModelRunner, StepLogits
from engine.outputs import RequestOutput
from engine.scheduled_batch import ScheduledBatch
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus
from engine.stats import EngineStats
from engine.step_faults import StepFaults
from engine.step_inputs import PLACEHOLDER

Fail = Callable[[Sequence, Exception, list[RequestOutput]], None]


class StepRuns:
    """Runs each scheduled batch and hands back what the update needs, in order: the tokens of
    the step in flight (``InFlightStep``), then this step's logits if it ran now (``StepLogits``).
    A launched step stays ``in_flight`` until the next call (or ``take_in_flight``)."""

    def __init__(
        self, runner: ModelRunner, scheduler: Scheduler, block_manager: BlockManager, stats: EngineStats,
        overlapped: bool, host_bound: set[str], beams: BeamRequests, fail: Fail,
    ) -> None:
        self.runner, self.scheduler, self.block_manager, self.stats = runner, scheduler, block_manager, stats
        self.overlapped = overlapped  # async scheduling
        # requests whose steps need the host per token (grammar, logprobs, forks); while there are
        # none, a step is overlappable without looking at its sequences (a stale id only costs that)
        self.host_bound, self.beams = host_bound, beams
        self.faults = StepFaults(self.forward, scheduler, block_manager, fail)
        self.in_flight: InFlightStep | None = None  # the launched step whose tokens are not back yet
        # Test hook: called with the sequences of every forward pass; raising simulates a fault.
        self.fault_injector: Callable[[list[Sequence]], None] | None = None

    def run(self, batch: ScheduledBatch, finished: list[RequestOutput]) -> Iterator[InFlightStep | StepLogits]:
        """Launch ``batch`` over the step in flight, or run it now once that step is applied (the
        caller applies each result before asking for the next). Failed requests go to ``finished``."""
        previous, self.in_flight = self.in_flight, None
        launched = None
        if batch and self.overlapped and self._overlappable(batch):
            launched = self.runner.launch(batch, previous)
            self.stats.on_computed(self.scheduler, self.block_manager)
        if previous is not None:
            yield previous
        if launched is not None:
            done = SequenceStatus.FINISHED  # (not the is_finished property: a thousand calls a step)
            for seq in launched.sample_seqs:
                if seq.status is not done:
                    seq.token_ids.append(PLACEHOLDER)
                    seq.num_pending_tokens = 1
            self.in_flight = launched
            return
        if batch and self.overlapped:
            batch.keep([not seq.is_finished for seq in batch.seqs])  # stopped at step t
        if batch:
            step = self.faults.execute(batch, finished)
            self.stats.on_computed(self.scheduler, self.block_manager)
            yield step

    def _overlappable(self, batch: ScheduledBatch) -> bool:
        if self.fault_injector is not None or batch.wants_prompt_logits or batch.wants_hidden:
            return False
        return not self.host_bound or all(
            seq.matcher is None and seq.logprobs is None and not seq.pending_forks
            and seq.request_id not in self.beams.requests for seq in batch.seqs
        )

    def forward(self, batch: ScheduledBatch) -> StepLogits:
        """One forward pass, now (``StepFaults`` reruns a failing step's requests through it)."""
        if self.fault_injector is not None:
            self.fault_injector(batch.seqs)
        return self.runner.execute(batch)

    def take_in_flight(self) -> InFlightStep | None:
        """The launched step, no longer in flight here (its tokens are the caller's to apply)."""
        step, self.in_flight = self.in_flight, None
        return step
