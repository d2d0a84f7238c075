"""Decides, every step, which sequences run and how many of their tokens.

There is no prefill phase and no decode phase: each running sequence asks for the
tokens it has not computed yet (a whole prompt, a chunk of it, or one decode token),
running sequences are served first, and what is left of the token budget admits
waiting ones, chunking the last prompt that does not fit.

A sequence's ``priority`` (vLLM's convention: lower goes first; 0 by default) orders both
queues: a waiting sequence is admitted before every waiting one of a higher number, and the
running list keeps lower numbers in front, so they are scheduled first and preempted last
(``tokenmill serve`` gives its live routes' requests -1, ahead of the jobs sharing the engine).
With one priority, as everywhere else, the queues are first come, first served.

The scheduler owns the queues and each step's post-processing (``update``: append the
sampled tokens, stop, finish, free). Plain Python over sequences, ids and counts: no torch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping

from engine.block_manager import BlockManager
from engine.scheduled_batch import ScheduledBatch, ScheduledSequence
from engine.sequence import Sequence, SequenceStatus
from engine.stopping import StopConditions

SCHEDULING_POLICIES = ("continuous", "static")


def _place(queue: deque[Sequence] | list[Sequence], seq: Sequence, front: bool = False) -> None:
    """Behind the sequences of its priority or a lower number (``front``: ahead of those of its
    own, for one that had run); with one priority, an append (or an appendleft)."""
    p = seq.priority
    if not queue or (queue[0].priority >= p if front else queue[-1].priority <= p):
        queue.insert(0 if front else len(queue), seq)
    else:
        queue.insert(next((i for i, s in enumerate(queue) if s.priority > p or (front and s.priority == p)),
                          len(queue)), seq)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 2048,
        policy: str = "continuous",
        stop: StopConditions | None = None,
    ) -> None:
        if policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling must be one of {SCHEDULING_POLICIES}, got {policy!r}")
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy
        self.stop = stop if stop is not None else StopConditions()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.step_count = 0
        self.num_preemptions = 0
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0
        self._cohort_slots = 0  # static policy: admissions left in the current cohort
        # Requests not queued yet (LLMEngine.add_requests): admission that finds ``waiting`` empty
        # calls it, and it queues the next one (True) or has none left (False). Queueing each
        # request as admission reaches it admits exactly what queueing them all first would.
        self.source: Callable[[], bool] | None = None

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.stop.attach(seq)
        _place(self.waiting, seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running) or self.source is not None

    def schedule(self) -> ScheduledBatch:
        self.step_count += 1
        batch = ScheduledBatch(step=self.step_count)
        budget = self.max_num_batched_tokens
        # One pass over the running sequences builds the step's columns: single-token steps of
        # sequences with a context (decodes) in front, as the runner wants them, the rest after.
        seqs, computeds, samples = batch.seqs, batch.num_computed_tokens, batch.samples
        chunks: list[ScheduledSequence] = []  # prompt chunks and admissions, after the decodes
        prompt_tokens = 0
        i = 0
        running = self.running
        while i < len(running) and budget > 0:
            seq = running[i]
            computed = seq.num_computed_tokens
            num_tokens = len(seq.token_ids)
            num_new = num_tokens - computed
            # its pending token is its last (known before it lands): no step past its end
            if seq.num_pending_tokens and num_tokens >= seq.max_total_tokens:  # stop.length_limit reached
                self._drain(running.pop(i))  # its slot and blocks go now
                continue
            if num_new == 0:
                i += 1
                continue
            if num_new > budget:
                num_new = budget
            total = computed + num_new
            # the block manager's promise spares most decodes the call
            if total > seq.slots_ready_until and not self._allocate(seq, num_new, batch.preempted):
                continue  # it was preempted itself, the last of the running ones
            seq.num_computed_tokens = total
            if num_new == 1 and computed:  # a decode (is_decode): three appends, no object
                seqs.append(seq)
                computeds.append(computed)
                samples.append(total == num_tokens)
            else:
                chunks.append(ScheduledSequence(seq, num_new, computed, total == num_tokens))
            if num_new > 1 or computed < len(seq.prompt_token_ids) or seq.num_preemptions:
                prompt_tokens += self._prompt_tokens(seq, computed, num_new)
                if seq.needs_prompt_logits:
                    batch.wants_prompt_logits = True
                if seq.pooling is not None:
                    batch.wants_hidden = True
            budget -= num_new
            i += 1

        if not batch.preempted:
            admitted: list[tuple[Sequence, int]] = []
            self._admit(admitted, budget)
            for seq, num_new in admitted:
                computed = seq.num_computed_tokens
                total = seq.num_computed_tokens = computed + num_new
                chunks.append(ScheduledSequence(seq, num_new, computed, total == len(seq.token_ids)))
                prompt_tokens += self._prompt_tokens(seq, computed, num_new)
                if seq.needs_prompt_logits:
                    batch.wants_prompt_logits = True
                if seq.pooling is not None:
                    batch.wants_hidden = True
        batch.num_decodes = len(seqs)
        batch.num_new_tokens = [1] * len(seqs)
        for item in chunks:
            batch.append(item)
        batch.num_prompt_tokens = prompt_tokens
        return batch

    def _allocate(self, seq: Sequence, num_new: int, preempted: list[Sequence]) -> bool:
        """Room for ``seq``'s next tokens, preempting running sequences from the back while the
        pool is too full; False if ``seq`` itself had to go (it was the last one running)."""
        while not self.block_manager.allocate_slots(seq, num_new):
            victim = self.running.pop()  # never one already scheduled: those sit before it
            self._preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        return True

    @staticmethod
    def _prompt_tokens(seq: Sequence, computed: int, num_new: int) -> int:
        """How many of these tokens compute the prompt (or, after a preemption, the outputs again)."""
        left = seq.num_prompt_tokens - computed
        if seq.num_preemptions:
            left = seq.num_tokens - 1 - computed
        return max(0, min(num_new, left))

    def _admit(self, chosen: list[tuple[Sequence, int]], budget: int) -> None:
        """Move waiting sequences to running while the token budget, the batch size and the
        free blocks allow."""
        bm = self.block_manager
        if self.policy == "static" and not self.running and self._cohort_slots == 0:
            self._cohort_slots = min(self.max_num_seqs, len(self.waiting))
        while budget > 0 and len(self.running) < self.max_num_seqs and (
                self.waiting or (self.source is not None and self.source())):
            if self.policy == "static" and self._cohort_slots == 0:
                break
            seq = self.waiting[0]
            if seq.num_pending_tokens:
                break  # preempted while its last token was in flight: admitted once it lands
            cached = bm.find_cached_prefix(seq)
            num_new = min(seq.num_tokens - len(cached) * bm.block_size, budget)
            if not bm.admit(seq, cached, num_new):
                break
            self.waiting.popleft()
            self.prefix_query_tokens += seq.num_tokens
            self.prefix_hit_tokens += len(cached) * bm.block_size
            if seq.num_preemptions == 0:
                seq.num_cached_prompt_tokens = len(cached) * bm.block_size
            seq.status = SequenceStatus.RUNNING
            if seq.first_scheduled_step is None:
                seq.first_scheduled_step = self.step_count
            _place(self.running, seq)
            chosen.append((seq, num_new))
            budget -= num_new
            if self.policy == "static":
                self._cohort_slots -= 1

    def update(self, sampled: Mapping[Sequence, int]) -> list[Sequence]:
        """A step's post-processing. ``sampled`` maps every sequence that sampled this step
        (forked samples included) to its new token: append it, check the stop conditions, and
        finish and free the sequences it stops; returns those, in ``sampled``'s order."""
        finished = []
        finish_reason = self.stop.finish_reason
        for seq, token in sampled.items():
            ids = seq.token_ids
            if seq.num_pending_tokens:
                ids[-1] = token  # the placeholder the next step was scheduled with
                seq.num_pending_tokens = 0
            else:
                ids.append(token)
            ending = seq.ending_token_ids
            if ending is not None and token not in ending and len(ids) < seq.max_total_tokens:
                continue  # what finish_reason would say (None), without the call
            reason = finish_reason(seq, token)
            if reason is not None:
                if seq.status is SequenceStatus.RUNNING:  # (a drained one published as it drained)
                    self.block_manager.publish_computed(seq)
                self.finish(seq, reason)
                finished.append(seq)
        return finished

    def _drain(self, seq: Sequence) -> None:
        """The in-flight token ends it: free its batch slot and blocks for this very schedule, as
        the synchronous engine would have. Its KV writes still queued on the device come before
        any later step's, so a new owner of the blocks is not disturbed (nor a request that maps
        a block published here)."""
        self.block_manager.publish_computed(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.DRAINING

    def fork(self, parent: Sequence, child: Sequence) -> tuple[int, int] | None:
        """Run ``child`` alongside ``parent`` from the parent's computed prompt: it shares the
        parent's full blocks, and gets a fresh one for the partial block whose contents the
        caller copies (the returned ``(source, destination)``; None when nothing to copy)."""
        self.stop.attach(child)
        pair = self.block_manager.fork(parent, child)
        child.num_cached_prompt_tokens = parent.num_cached_prompt_tokens
        child.first_scheduled_step = parent.first_scheduled_step
        child.status = SequenceStatus.RUNNING
        _place(self.running, child)
        return pair

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._preempt(seq)

    def _preempt(self, seq: Sequence) -> None:
        """Recompute-style preemption: drop the KV, keep the tokens, queue at the front."""
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.PREEMPTED
        self.num_preemptions += 1
        if self.policy == "static":
            self._cohort_slots += 1
        _place(self.waiting, seq, front=True)

    def park(self, seq: Sequence) -> None:
        """Take a sequence out of both queues, its KV freed and its tokens kept: beam search parks
        a beam whose next-token candidates are known while its siblings catch up, so that idle
        beams never hold the blocks a sibling needs. ``requeue`` brings it back."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            seq.num_preemptions += 1
            self.num_preemptions += 1
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.PREEMPTED

    def requeue(self, seq: Sequence) -> None:
        """Queue a sequence with no KV at the front, as a preempted one (a parked beam, or one
        forked from it)."""
        self.stop.attach(seq)
        seq.status = SequenceStatus.PREEMPTED
        _place(self.waiting, seq, front=True)

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.PREEMPTED:  # async: preempted while its stopping token was in flight
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.finished_step = self.step_count
        self.block_manager.free(seq)

    def abort(self, seq: Sequence, reason: str = "abort") -> None:
        """Remove a sequence wherever it is (waiting or running)."""
        if seq in self.running:
            self.finish(seq, reason)
        else:
            if seq in self.waiting:
                self.waiting.remove(seq)
            self.block_manager.free(seq)
            seq.status = SequenceStatus.FINISHED
            seq.finish_reason = reason
            seq.finished_step = self.step_count
