"""Each key's share of the live engine: bounded work per request and per key, turns in rotation.

One request of 2,048 prompts with ``n`` = 128 asked for 262,144 sequences; the live engine took
them all first-come-first-served and a 2-token chat of another key waited behind all of them.
Here a request's work is bounded when it arrives (sequences = prompts x n, and tokens =
(prompt + max_tokens) x n summed), a key may have only so many sequences waiting or running,
and the live engine feeds its engine from this queue: one prompt per key in rotation, only
while the engine holds fewer sequences than its batch (``max_num_seqs``), so a new key's
prompt enters at the next free slot instead of after every earlier prompt.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.errors import APIError, bad_request


@dataclass(frozen=True)
class ShareLimits:
    request_sequences: int = 2048  # prompts x n in one request
    request_tokens: int = 2_000_000  # (prompt + max_tokens) x n, summed over the prompts
    key_sequences: int = 4096  # waiting or running in the live engine, per key


def request_work(prompts: Sequence[Sequence[int]], params: Sequence[Any]) -> tuple[int, int]:
    """(sequences, tokens) a request asks of the engine."""
    sequences = sum(p.n for p in params)
    tokens = sum((len(prompt) + p.max_tokens) * p.n for prompt, p in zip(prompts, params, strict=True))
    return sequences, tokens


class FairShare:
    """Thread-safe: request threads ``admit`` and ``release``; the engine thread ``push``es and ``take``s."""

    def __init__(self, limits: ShareLimits | None = None) -> None:
        self.limits = limits or ShareLimits()
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}  # sequences admitted and not yet released, per key
        self._waiting: OrderedDict[str, deque[tuple[Any, int]]] = OrderedDict()  # key -> (call, prompt index)

    def admit(self, owner: str, prompts: Sequence[Sequence[int]], params: Sequence[Any]) -> int:
        """Count a request against its key, or refuse it (400 over a request's bound, 429 over the
        key's share). Returns the sequences to ``release`` when the request ends, however it ends."""
        sequences, tokens = request_work(prompts, params)
        limits = self.limits
        if sequences > limits.request_sequences:
            raise bad_request(f"this request asks for {sequences} sequences (prompts x n); the limit is "
                              f"{limits.request_sequences}", "n", "request_too_large")
        if tokens > limits.request_tokens:
            raise bad_request(f"this request asks for up to {tokens} tokens ((prompt + max_tokens) x n); the "
                              f"limit is {limits.request_tokens}", "max_tokens", "request_too_large")
        with self._lock:
            held = self._held.get(owner, 0)
            if held + sequences > limits.key_sequences:
                raise APIError(429, f"this key has {held} sequences waiting or running; at most "
                                    f"{limits.key_sequences}: retry when some finish", code="rate_limit_exceeded")
            self._held[owner] = held + sequences
        return sequences

    def release(self, owner: str, sequences: int) -> None:
        with self._lock:
            left = self._held.get(owner, 0) - sequences
            if left > 0:
                self._held[owner] = left
            else:
                self._held.pop(owner, None)

    def push(self, owner: str, call: Any, count: int) -> None:
        """Queue a call's ``count`` prompts behind its key's earlier ones."""
        self._waiting.setdefault(owner, deque()).extend((call, i) for i in range(count))

    def drop(self, future: Any) -> None:
        """Forget the prompts of the call of ``future`` that have not reached the engine."""
        for owner in list(self._waiting):
            kept = deque(item for item in self._waiting[owner] if item[0].future is not future)
            if kept:
                self._waiting[owner] = kept
            else:
                del self._waiting[owner]

    def take(self, room: int, batch: int, size: Any) -> list[tuple[Any, int]]:
        """Prompts for the engine, one per key in turn, while their sequences (``size(call, i)``)
        fit in ``room``; one at least when the engine is empty (``room`` is the whole ``batch``),
        so a prompt whose ``n`` is larger than the batch still runs."""
        taken: list[tuple[Any, int]] = []
        while self._waiting and room > 0:
            progressed = False
            for owner in list(self._waiting):
                queue = self._waiting[owner]
                need = size(*queue[0])
                if need > room and not (room >= batch and not taken):
                    continue
                taken.append(queue.popleft())
                room -= need
                progressed = True
                self._waiting.move_to_end(owner)  # the next turn starts with another key
                if not queue:
                    del self._waiting[owner]
                if room <= 0:
                    return taken
            if not progressed:
                break
        return taken

    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())
