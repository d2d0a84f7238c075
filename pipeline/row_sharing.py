"""Rows not computed twice (issue 28): the result a row takes instead of entering the engine.

In this order: the previous part's row with the same content key (a re-run of a changed
shard), then a result computed earlier in this run for the same key (identical prompts and
sampling within a job, greedy or seeded only), else the row goes into the engine under its
key, and identical rows admitted while it runs follow it (``pipeline.in_flight``). Results
computed in the run are remembered for the last ``SHARED_RESULTS`` keys only: duplicates
further apart than that are computed again, which costs time, never correctness.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from pipeline.plan import JobPlan
from pipeline.row_keys import ContentKeys, shareable
from pipeline.row_requests import SubRequest

if TYPE_CHECKING:
    from pipeline.shard_opening import OpenShard

SHARED_RESULTS = 4096


class RowSharing:
    def __init__(self, plan: JobPlan, capacity: int = SHARED_RESULTS) -> None:
        self.keys = ContentKeys(plan)
        self.capacity = capacity
        self.done: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def decide(self, shard: OpenShard, subs: list[SubRequest]) -> tuple[str, str | None, dict[str, Any] | None]:
        """(the row's content key, the key it may lead or follow under in the engine or None,
        the values it takes instead of being computed or None); counts reused and shared rows."""
        key = self.keys.key(subs)
        values = shard.previous.values(key) if shard.previous is not None else None
        if values is not None:
            shard.rows_reused += 1
            return key, None, values
        if not shareable(subs):
            return key, None, None
        values = self.done.get(key)
        if values is not None:
            self.done.move_to_end(key)
            shard.rows_shared += 1
        return key, key, values

    def remember(self, key: str, values: dict[str, Any]) -> None:
        """A finished result for later rows with ``key`` (not an error: it may be transient)."""
        if values.get("error"):
            return
        self.done[key] = values
        self.done.move_to_end(key)
        while len(self.done) > self.capacity:
            self.done.popitem(last=False)
