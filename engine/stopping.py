"""When a sequence stops: EOS, stop tokens and strings, a finished grammar, max_tokens, the context."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from engine.sequence import Sequence

# Where a stop string starts in the sequence's output text, or None (see engine/output_processor.py).
StopStringFinder = Callable[[Sequence], int | None]


@dataclass(frozen=True)
class StopConditions:
    """What ends a sequence besides its own sampling parameters: the model's EOS ids, its
    context length, and the stop-string finder (None where there is no tokenizer)."""

    eos_token_ids: frozenset[int] = frozenset()
    max_model_len: int = sys.maxsize
    find_stop_string: StopStringFinder | None = None

    def finish_reason(self, seq: Sequence, token: int) -> str | None:
        """Why the sequence stops after ``token`` (already appended), or None. A grammar that is
        complete stops it too."""
        p = seq.params
        if seq.matcher is not None:
            if not seq.matcher.accept_token(token):
                seq.matcher = None  # cannot happen with the mask applied; end the sample rather than loop
                return "stop"
            if seq.matcher.is_terminated():
                return "stop"
        if not p.ignore_eos and token in self.eos_token_ids:
            return "stop"
        if token in p.stop_token_ids:
            return "stop"
        if p.stop and self.find_stop_string is not None:
            cut = self.find_stop_string(seq)
            if cut is not None:
                seq.stop_text_end = cut
                return "stop"
        if self.ends_by_length(seq):
            return "length"
        return None

    def ends_by_length(self, seq: Sequence) -> bool:
        """The sequence has its ``max_tokens`` outputs or fills the model's context. Lengths are
        taken directly: this runs for every running sequence at every step."""
        n = len(seq.token_ids)
        return n - len(seq.prompt_token_ids) >= seq.params.max_tokens or n >= self.max_model_len
