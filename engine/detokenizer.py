"""A sequence's output text, grown token by token, for stop strings.

Decoding a request's full output after each new token to look for its stop strings costs
time quadratic in the output's length. Here each sequence's text grows by the piece its new
token adds: the tokens from a little before the last read point are decoded (so a token
whose text depends on its neighbours, or a multi-byte character split over tokens, comes out
right) and only the new suffix is appended; a piece ending in an incomplete character is searched
but kept back until the next token completes it. The special tokens a full decode skips are
dropped as they arrive, so no step walks the whole output. Only the tail that can hold a new
match is searched. When a stop string shows up, the exact cut is taken from one full decode,
so the result is the same as decoding everything every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.sequence import Sequence

_INCOMPLETE = "\ufffd"  # what a decode of a partial UTF-8 sequence ends with
_CONTEXT = 5  # tokens decoded before the read point


@dataclass
class IncrementalText:
    """One sequence's decoding progress; it lives on the sequence (``Sequence.incremental_text``)."""

    ids: list[int] = field(default_factory=list)  # output tokens that are not special tokens
    num_seen: int = 0  # output tokens looked at so far, special ones included
    text: str = ""  # the decode of ``ids[:read]``
    prefix: int = 0  # ids[prefix:read] were decoded last time, as context for the next piece
    read: int = 0


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.special = set(getattr(tokenizer, "all_special_ids", []) or [])

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids`` as a full decode gives it: special tokens skipped."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def find_stop(self, seq: Sequence, stops: list[str]) -> int | None:
        """Where the first stop string starts in the output text, or None; call after every token."""
        st = seq.incremental_text
        if st is None:
            st = seq.incremental_text = IncrementalText()
        new = seq.token_ids[seq.num_prompt_tokens + st.num_seen :]
        st.num_seen += len(new)
        st.ids.extend(t for t in new if t not in self.special)
        ids = st.ids
        if len(ids) <= st.read:
            return None
        before = self.decode(ids[st.prefix : st.read])
        after = self.decode(ids[st.prefix :])
        if not after.startswith(before):  # the new token changed earlier text: resync once
            st.text = self.decode(ids)
            st.prefix, st.read = max(0, len(ids) - _CONTEXT), len(ids)
            return self._confirm(seq, st.text, stops, 0)
        piece = after[len(before) :]
        start = max(0, len(st.text) - max(len(s) for s in stops) + 1)
        if piece.endswith(_INCOMPLETE):  # search what is complete, keep the rest for later
            return self._confirm(seq, st.text + piece.rstrip(_INCOMPLETE), stops, start)
        st.text += piece
        st.prefix, st.read = max(0, len(ids) - _CONTEXT), len(ids)
        return self._confirm(seq, st.text, stops, start)

    def _confirm(self, seq: Sequence, text: str, stops: list[str], start: int) -> int | None:
        if not any(text.find(s, start) >= 0 for s in stops):
            return None
        full = self.decode(seq.output_token_ids)
        return min((i for i in (full.find(s) for s in stops) if i >= 0), default=None)
