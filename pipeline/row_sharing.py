"""Rows not computed twice (issue 28): the result a row takes instead of entering the engine.

In this order: the previous part's row with the same content key (a re-run of a changed
shard), or any part's in the output (a row moved to another file), then a result computed earlier in this run for the same key (identical prompts and
sampling within a job, greedy or seeded only), else the row goes into the engine under its
key, and identical rows admitted while it runs follow it (``pipeline.in_flight``). Results
computed in the run are remembered for the last ``SHARED_RESULTS`` keys only: duplicates
further apart than that are computed again, which costs time, never correctness.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from pipeline.in_flight import InFlight, InFlightRequests
from pipeline.plan import JobPlan
from pipeline.previous_rows import PreviousRows, load_output_rows
from pipeline.result_row import RequestResult, ResultRow
from pipeline.result_rows import ResultRows
from pipeline.row_keys import ContentKeys, shareable
from pipeline.row_preparation import PreparedRow
from pipeline.sub_requests import SubRequest

if TYPE_CHECKING:
    from pipeline.shard_opening import OpenShard

# The driver's way to hand a finished row to its shard: (shard, row, result row, notify).
Complete = Callable[["OpenShard", PreparedRow, ResultRow, bool], None]

SHARED_RESULTS = 4096


class Decision(NamedTuple):
    """Where a row's result comes from."""

    key: str  # the row's content key
    share: str | None  # the key it may lead or follow under in the engine, or None
    result: RequestResult | None  # what it takes instead of being computed, or None


class RowSharing:
    """``admit`` a row (its result taken, or its requests into the engine); ``fan_out`` a finished
    row's result to the rows that followed it."""

    def __init__(self, plan: JobPlan, in_flight: InFlightRequests, results: ResultRows, complete: Complete,
                 capacity: int = SHARED_RESULTS) -> None:
        self.keys = ContentKeys(plan)
        self.in_flight, self.results, self.complete = in_flight, results, complete
        self.capacity = capacity
        self.done: OrderedDict[str, RequestResult] = OrderedDict()
        self.plan, self._output_rows, self._output_loaded = plan, None, False

    def output_rows(self) -> PreviousRows | None:
        """Every part of the output by content key, read once, at the run's first row (a shard
        whose rows are all error rows commits without one: a part it replaces is not read)."""
        if not self._output_loaded:
            self._output_loaded, self._output_rows = True, load_output_rows(self.plan)
        return self._output_rows

    def admit(self, shard: OpenShard, row: PreparedRow, subs: list[SubRequest]) -> str | None:
        """Give the row an earlier result, or queue its requests; the engine's refusal if it refuses."""
        row.key, share, result = self.decide(shard, subs)
        if result is None:
            return self.in_flight.add(shard, row, subs, share)
        self.complete(shard, row, self.results.build(row.record, result, content_key=row.key), True)
        return None

    def fan_out(self, inf: InFlight, result: RequestResult, now: float) -> list[OpenShard]:
        """The result of a finished row to the rows that followed it; returns their shards."""
        inf.shard.output_tokens_computed += result.output_tokens or 0  # a row the engine computed
        key = inf.group.key
        if key is None:
            return []
        self.remember(key, result)
        followers = self.in_flight.release_followers(inf.group)
        for f in followers:
            f.shard.rows_shared += 1
            row = self.results.build(f.row.record, result, latency_s=now - f.admitted_at, content_key=key)
            self.complete(f.shard, f.row, row, False)
        return [f.shard for f in followers]

    def decide(self, shard: OpenShard, subs: list[SubRequest]) -> Decision:
        """Where the row's result comes from; counts reused and shared rows."""
        key = self.keys.key(subs)
        output = self.output_rows()  # read at the run's first row: before this run replaces any part
        result = shard.previous.result(key) if shard.previous is not None else None
        if result is None and output is not None:  # a row that moved from another file
            result = output.result(key)
        if result is not None:
            shard.rows_reused += 1
            return Decision(key, None, result)
        if not shareable(subs):
            return Decision(key, None, None)
        result = self.done.get(key)
        if result is not None:
            self.done.move_to_end(key)
            shard.rows_shared += 1
        return Decision(key, key, result)

    def remember(self, key: str, result: RequestResult) -> None:
        """A finished result for later rows with ``key`` (not an error: it may be transient)."""
        if result.error:
            return
        self.done[key] = result
        self.done.move_to_end(key)
        while len(self.done) > self.capacity:
            self.done.popitem(last=False)
