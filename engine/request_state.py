"""A request as the engine tracks it: its ``n`` sample sequences and what they share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engine.logprobs import decode_entries
from engine.outputs import CompletionOutput, PositionLogprobs, RequestMetrics, RequestOutput
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence


@dataclass(eq=False)
class RequestState:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence] = field(default_factory=list)  # sample 0 first; the others once forked
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    num_finished: int = 0
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.num_finished == self.params.n


def build_output(
    state: RequestState, decode_text: Callable[[list[int]], str] | None, decode_token: Callable[[int], str] | None
) -> RequestOutput:
    """The output of a finished request; without a tokenizer texts are empty."""
    completions = []
    for seq in sorted(state.seqs, key=lambda s: s.sample_index):
        text = ""
        if decode_text is not None:
            text = decode_text(seq.output_token_ids)
            if seq.stop_text_end is not None:
                text = text[: seq.stop_text_end]
        if seq.logprobs is not None and decode_token is not None:
            decode_entries(seq.logprobs, decode_token)
        completions.append(
            CompletionOutput(
                seq.sample_index, list(seq.output_token_ids), text, seq.finish_reason, seq.logprobs,
                seq.cumulative_logprob if seq.logprobs is not None else None,
            )
        )
    if state.prompt_logprobs is not None and decode_token is not None:
        decode_entries(state.prompt_logprobs, decode_token)
    first = state.seqs[0]
    metrics = RequestMetrics(
        num_cached_prompt_tokens=first.num_cached_prompt_tokens,
        num_preemptions=sum(s.num_preemptions for s in state.seqs),
        first_scheduled_step=first.first_scheduled_step,
        finished_step=max((s.finished_step or 0) for s in state.seqs) if state.seqs else None,
    )
    return RequestOutput.from_completions(
        state.request_id, list(state.prompt_token_ids), completions, error=state.error, metrics=metrics,
        prompt_logprobs=state.prompt_logprobs,
    )
