"""Stop strings without decoding the whole output every step.

Decoding a request's full output after each new token to look for its stop strings costs
time quadratic in the output's length. Here each request's text grows by the piece its new
token adds: the tokens from a little before the last read point are decoded (so a token
whose text depends on its neighbours, or a multi-byte character split over tokens, comes out
right) and only the new suffix is appended; a piece ending in an incomplete character is searched
but kept back until the next token completes it. Only the tail that can hold a new match is searched. When a stop string
shows up, the exact cut is taken from one full decode, so the result is the same as decoding
everything every step.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.sequence import Sequence

_INCOMPLETE = "\ufffd"  # what a decode of a partial UTF-8 sequence ends with
_CONTEXT = 5  # tokens decoded before the read point


@dataclass
class _State:
    text: str = ""
    prefix: int = 0  # output tokens [prefix, read) were decoded last time, for context
    read: int = 0  # output tokens before this are in ``text``


class StopStringMatcher:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.special = set(getattr(tokenizer, "all_special_ids", []) or [])
        self.states: dict[tuple[str, int], _State] = {}

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def find(self, seq: Sequence, stops: list[str]) -> int | None:
        """Where the first stop string starts in the output text, or None; call after every token."""
        st = self.states.setdefault(self._key(seq), _State())
        ids = [t for t in seq.output_token_ids if t not in self.special]
        if len(ids) <= st.read:
            return None
        before = self._decode(ids[st.prefix : st.read])
        after = self._decode(ids[st.prefix :])
        if not after.startswith(before):  # the new token changed earlier text: resync once
            st.text = self._decode(ids)
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
        full = self._decode(seq.output_token_ids)
        return min((i for i in (full.find(s) for s in stops) if i >= 0), default=None)

    @staticmethod
    def _key(seq: Sequence) -> tuple[str, int]:
        return seq.request_id, getattr(seq, "sample_index", 0)

    def forget(self, seq: Sequence) -> None:
        self.states.pop(self._key(seq), None)
