"""A request shape (``pipeline.kind_stages``): a row that carries its prompt as token ids (issue 27).

A client that tokenizes for itself (lm-evaluation-harness, whose tokenization decides its
scores) hands the fleet finished prompts, so nothing here renders or tokenizes. A row is
one of two requests:

- scored: ``prompt`` plus ``score_from``, the first prompt position whose token counts. The
  engine computes logprobs from there on only (``prompt_logprobs_start``), so a context
  shared by several rows comes from the prefix cache. The row gets ``logprob``, the sum over
  the scored tokens, and ``is_greedy``, whether each of them was the most likely token.
- generated: ``prompt`` alone, with the row's own sampling settings in the plan's
  ``sampling_field`` over the plan's; the row gets the text as ``output``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from engine import SamplingParams
from pipeline.sub_requests import RowGroup, RowInputError, SubRequest

PROMPT_FIELD = "prompt"
SCORE_FROM_FIELD = "score_from"
SAMPLING_FIELD = "sampling"  # a generated row's own settings (the plan's ``sampling_field``)
COLUMNS = {"logprob": "float64", "is_greedy": "bool"}
# What a generated row may set for itself: what lm-evaluation-harness's generate_until passes.
# Not n, logprobs, prompt logprobs or a grammar: they cost far more than a row and no harness
# request asks for them (a spec of this kind arriving over HTTP must not reach them either).
# Beam search is generate_until's num_beams (harness/gen_kwargs.py).
ROW_BEAM_SEARCH = frozenset({"beam_width", "length_penalty", "early_stopping"})
ROW_SAMPLING = frozenset({"max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids",
                          "ignore_eos"}) | ROW_BEAM_SEARCH
_DEFAULTS = SamplingParams().to_dict()  # a field left at its default asks for nothing more


def _token_ids(value: Any, row: int) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(t, int) and t >= 0 for t in value):
        raise RowInputError(f"row {row}: field {PROMPT_FIELD!r} must be a non-empty list of token ids")
    return value


class TokenRequests:
    """Builds a row's one request from its token ids and reads its values back."""

    columns: ClassVar[tuple[str, ...]] = tuple(COLUMNS)

    def __init__(self, plan: Any, engine: Any, row_params: Callable[[dict[str, Any], int], SamplingParams]) -> None:
        self.row_params = row_params  # the plan's sampling under the row's own (RequestBuilder.row_params)

    def build(self, fields: dict[str, Any], row: int, messages: list[dict[str, str]]) -> list[SubRequest]:
        prompt = _token_ids(fields.get(PROMPT_FIELD), row)
        start = fields.get(SCORE_FROM_FIELD)
        if start is None:
            own = fields.get(SAMPLING_FIELD)
            extra = sorted(k for k, v in own.items()
                           if k not in ROW_SAMPLING and (k not in _DEFAULTS or v != _DEFAULTS[k])) \
                if isinstance(own, dict) else []
            if extra:
                raise RowInputError(f"row {row}: field {SAMPLING_FIELD!r} may set only {', '.join(sorted(ROW_SAMPLING))}"
                                    f" (not {', '.join(extra)})")
            return [SubRequest(prompt, self.row_params(fields, row))]
        if isinstance(start, bool) or not isinstance(start, int) or not 1 <= start < len(prompt):
            raise RowInputError(f"row {row}: field {SCORE_FROM_FIELD!r} must be an integer from 1 to "
                                f"{len(prompt) - 1} (the prompt has {len(prompt)} tokens)")
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, prompt_logprobs_start=start)
        return [SubRequest(prompt, params, scored_from=start)]

    def values(self, group: RowGroup) -> dict[str, Any]:
        """The row's columns once its request finished without an error."""
        (sub,), out = group.subs, group.outputs[0]
        if sub.scored_from is None:
            return {"output": out.text, "finish_reason": out.finish_reason, "output_tokens": len(out.token_ids)}
        entries = out.prompt_logprobs
        if entries is None or len(entries) != len(sub.token_ids):
            raise RuntimeError(f"the engine returned no prompt logprobs for {len(sub.token_ids)} prompt tokens")
        scored = [entries[p][sub.token_ids[p]] for p in range(sub.scored_from, len(sub.token_ids))]
        return {"logprob": sum(e.logprob for e in scored), "is_greedy": all(e.rank == 1 for e in scored)}
