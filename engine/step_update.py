"""The *update* of a step: its results back into the requests, and the finished ones out."""

from __future__ import annotations

from engine.beam_requests import BeamRequest, BeamRequests
from engine.logprobs import prompt_logprobs_for_rows
from engine.model_runner import InFlightStep, StepLogits
from engine.output_processor import OutputProcessor
from engine.outputs import RequestOutput
from engine.pooling import accumulate
from engine.request_state import RequestState
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus
from engine.stats import EngineStats
from engine.step_sampling import StepSampler


class StepUpdate:
    """``update(ran, finished)``: a step's logits are sampled (``StepSampler``), or a launched
    step's tokens waited for; the tokens go to the scheduler (which stops, finishes and frees),
    prompt logprobs and embeddings to their requests, and each request that is now complete
    goes to ``finished`` as a ``RequestOutput``."""

    def __init__(self, scheduler: Scheduler, sampler: StepSampler, output_processor: OutputProcessor,
                 requests: dict[str, RequestState], beams: BeamRequests, stats: EngineStats,
                 host_bound: set[str]) -> None:
        self.scheduler, self.sampler, self.output_processor = scheduler, sampler, output_processor
        self.requests, self.beams, self.stats, self.host_bound = requests, beams, stats, host_bound

    def __call__(self, ran: InFlightStep | StepLogits, finished: list[RequestOutput]) -> None:
        if isinstance(ran, InFlightStep):
            self.collect(ran, finished)
        else:
            self.logits(ran, finished)

    def logits(self, step: StepLogits, finished: list[RequestOutput]) -> None:
        """A step run now: prompt logprobs, embeddings, then its sampled tokens."""
        for seq, first, rows in step.prompt:
            k = seq.params.prompt_logprobs or 0
            entries = prompt_logprobs_for_rows(rows, seq.prompt_token_ids, first, k)
            self.requests[seq.request_id].prompt_logprobs[first + 1 : first + 1 + len(entries)] = entries
        for seq, first, rows in step.pooled:
            if (vector := accumulate(seq, first, rows)) is not None:
                self._finish_embedding(seq, vector, finished)
        if not step.sample_seqs:
            return
        sampled, ended = self.sampler(step.sample_seqs, step.logits)
        for request in ended:
            self._end_beam_search(request, finished)
        if sampled:
            self.tokens(sampled, finished)

    def collect(self, step: InFlightStep, finished: list[RequestOutput]) -> None:
        """Wait for a launched step's tokens and apply those of sequences still running."""
        tokens = step.wait()
        done = SequenceStatus.FINISHED
        self.tokens({s: t for s, t in zip(step.sample_seqs, tokens, strict=True) if s.status is not done}, finished)

    def tokens(self, sampled: dict[Sequence, int], finished: list[RequestOutput]) -> None:
        """Hand a step's tokens to the scheduler; collect the requests that are now complete."""
        self.stats.decode_tokens += len(sampled)
        for seq in self.scheduler.update(sampled):
            state = self.requests[seq.request_id]
            state.num_finished += 1
            if state.finished:
                finished.append(self.output_processor.build(state))
                del self.requests[seq.request_id]
                self.host_bound.discard(seq.request_id)

    def fail(self, seq: Sequence, error: Exception, finished: list[RequestOutput]) -> None:
        """Fail the whole request (all its samples) with the error."""
        state = self.requests.pop(seq.request_id)
        self.host_bound.discard(seq.request_id)
        self.beams.discard(seq.request_id)
        state.error = f"request {seq.request_id}: engine step failed: {type(error).__name__}: {error}"
        for s in state.seqs:
            if not s.is_finished:
                self.scheduler.abort(s, "error")
        finished.append(self.output_processor.build(state))

    def _finish_embedding(self, seq: Sequence, vector, finished: list[RequestOutput]) -> None:
        """An embedding is complete: its request ends in this step and its blocks are free now."""
        self.scheduler.finish(seq, "stop")
        state = self.requests.pop(seq.request_id)
        state.embedding, state.num_finished = vector, 1
        finished.append(self.output_processor.build(state))

    def _end_beam_search(self, request: BeamRequest, finished: list[RequestOutput]) -> None:
        rid = request.state.request_id
        metrics = request.metrics(self.scheduler.step_count)
        finished.append(self.output_processor.build_beams(request.state, request.group.finished, metrics))
        del self.requests[rid]
        self.host_bound.discard(rid)
