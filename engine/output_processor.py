"""From a request's tokens to what the user reads: stop strings as tokens arrive, and the
finished request's texts, decoded tokens and metrics."""

from __future__ import annotations

import functools
from typing import Any

from engine.beam_search import Hypothesis
from engine.detokenizer import IncrementalDetokenizer
from engine.logprobs import decode_entries
from engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from engine.request_state import RequestState
from engine.sequence import Sequence


class OutputProcessor:
    """One per engine. Without a tokenizer, texts are empty and stop strings never match."""

    def __init__(self, tokenizer: Any) -> None:
        self.detokenizer = IncrementalDetokenizer(tokenizer) if tokenizer is not None else None
        self._decode_token = None
        if tokenizer is not None:
            self._decode_token = functools.lru_cache(maxsize=1 << 16)(lambda t: tokenizer.decode([t]))

    def find_stop_string(self, seq: Sequence) -> int | None:
        """Where the first of the sequence's stop strings starts in its output text, or None."""
        if self.detokenizer is None or not seq.params.stop:
            return None
        return self.detokenizer.find_stop(seq, seq.params.stop)

    def _text(self, token_ids: list[int]) -> str:
        return self.detokenizer.decode(token_ids) if self.detokenizer is not None else ""

    def build_beams(self, state: RequestState, hypotheses: list[Hypothesis], metrics: RequestMetrics) -> RequestOutput:
        """The output of a finished beam search: its ``n`` best hypotheses, best first."""
        completions = [
            CompletionOutput(i, h.token_ids, self._text(h.token_ids), h.finish_reason, None, h.sum_logprobs, h.score)
            for i, h in enumerate(hypotheses[: state.params.n])
        ]
        if state.prompt_logprobs is not None and self._decode_token is not None:
            decode_entries(state.prompt_logprobs, self._decode_token)
        return RequestOutput.from_completions(
            state.request_id, list(state.prompt_token_ids), completions, error=state.error, metrics=metrics,
            prompt_logprobs=state.prompt_logprobs,
        )

    def build(self, state: RequestState) -> RequestOutput:
        """The output of a finished (or failed) request."""
        completions = []
        for seq in sorted(state.seqs, key=lambda s: s.sample_index):
            text = self._text(seq.output_token_ids)
            if seq.stop_text_end is not None:
                text = text[: seq.stop_text_end]
            if seq.logprobs is not None and self._decode_token is not None:
                decode_entries(seq.logprobs, self._decode_token)
            completions.append(
                CompletionOutput(
                    seq.sample_index, list(seq.output_token_ids), text, seq.finish_reason, seq.logprobs,
                    seq.cumulative_logprob if seq.logprobs is not None else None,
                )
            )
        if state.prompt_logprobs is not None and self._decode_token is not None:
            decode_entries(state.prompt_logprobs, self._decode_token)
        first = state.seqs[0]
        metrics = RequestMetrics(
            num_cached_prompt_tokens=first.num_cached_prompt_tokens,
            num_preemptions=sum(s.num_preemptions for s in state.seqs),
            first_scheduled_step=first.first_scheduled_step,
            finished_step=max((s.finished_step or 0) for s in state.seqs) if state.seqs else None,
        )
        return RequestOutput.from_completions(
            state.request_id, list(state.prompt_token_ids), completions, error=state.error, metrics=metrics,
            prompt_logprobs=state.prompt_logprobs, embedding=state.embedding,
        )
