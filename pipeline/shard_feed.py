"""Where the shard driver takes its shards from: a known list, or a live feed.

A worker's engine thread does not know its shards in advance: shard tasks arrive while
the engine runs. The driver asks the feed for the next shard whenever it has room, and
may wait briefly for one when the engine is idle.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from connectors import ShardRef


class ShardFeed(Protocol):
    """``next_shard(wait)`` returns the next shard, or None when there is none right now;
    with ``wait`` (the engine is idle) it may block briefly for one. ``closed`` is True
    once no more shards will come."""

    def next_shard(self, wait: bool) -> ShardRef | None: ...

    @property
    def closed(self) -> bool: ...


class ListFeed:
    """A known list of shards as a feed."""

    def __init__(self, shards: Iterable[ShardRef]) -> None:
        self._shards = iter(shards)
        self.closed = False

    def next_shard(self, wait: bool) -> ShardRef | None:
        ref = next(self._shards, None)
        self.closed = ref is None
        return ref
