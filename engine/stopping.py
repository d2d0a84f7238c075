"""When a sequence stops: EOS, stop tokens and strings, a finished grammar, max_tokens, the context."""

from __future__ import annotations

from typing import Any

from engine.sequence import Sequence


def finish_reason(
    seq: Sequence, token: int, eos_token_ids: set[int], max_model_len: int, stop_matcher: Any = None,
) -> str | None:
    """Why the sequence stops after ``token``, or None. A grammar that is complete stops it too.
    With a ``StopStringMatcher`` (engine/detokenizer.py) stop strings are matched incrementally."""
    p = seq.params
    if seq.matcher is not None:
        if not seq.matcher.accept_token(token):
            seq.matcher = None  # cannot happen with the mask applied; end the sample rather than loop
            return "stop"
        if seq.matcher.is_terminated():
            return "stop"
    if not p.ignore_eos and token in eos_token_ids:
        return "stop"
    if token in p.stop_token_ids:
        return "stop"
    if p.stop and stop_matcher is not None:
        cut = stop_matcher.find(seq, p.stop)
        if cut is not None:
            seq.stop_text_end = cut
            return "stop"
    if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= max_model_len:
        return "length"
    return None
