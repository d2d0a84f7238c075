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
        complete stops it too. Runs for every sampled token: the common case (no grammar, no
        stop strings) is a few attribute reads."""
        p = seq.params
        if seq.matcher is not None:
            if not seq.matcher.accept_token(token):
                seq.matcher = None  # cannot happen with the mask applied; end the sample rather than loop
                return "stop"
            if seq.matcher.is_terminated():
                return "stop"
        if token in self.eos_token_ids and not p.ignore_eos:
            return "stop"
        if p.stop_token_ids and token in p.stop_token_ids:
            return "stop"
        if p.stop and self.find_stop_string is not None:
            cut = self.find_stop_string(seq)
            if cut is not None:
                seq.stop_text_end = cut
                return "stop"
        if len(seq.token_ids) >= seq.max_total_tokens:  # its length_limit, stored on it
            return "length"
        return None

    def attach(self, seq: Sequence) -> None:
        """Store on a sequence entering the scheduler what its every-token check needs:
        ``max_total_tokens`` and, when nothing but EOS and its length can end it (no grammar,
        stop token ids or stop strings), ``ending_token_ids``, so that ``Scheduler.update``
        decides the common token without calling ``finish_reason``. Like the length limit, read
        once: a request's parameters are not changed after it is added."""
        seq.max_total_tokens = self.length_limit(seq)
        p = seq.params
        plain = seq.matcher is None and not p.stop_token_ids and not p.stop
        seq.ending_token_ids = (frozenset() if p.ignore_eos else self.eos_token_ids) if plain else None

    def length_limit(self, seq: Sequence) -> int:
        """How many tokens (prompt and outputs) the sequence may reach: its ``max_tokens``
        outputs, or the model's context (``attach`` stores it as ``seq.max_total_tokens``)."""
        return min(len(seq.prompt_token_ids) + seq.params.max_tokens, self.max_model_len)
