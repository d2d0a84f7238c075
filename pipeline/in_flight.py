"""The requests a driver has in the engine, and whose rows they are.

A row becomes one request, or several (one per answer choice when scoring); it is
finished when all of its requests are. Request ids are ``<nonce>:<shard>:<row>`` (plus
``#<i>`` per choice), unique per driver so two runs on one engine never collide.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine import RequestError, RequestOutput
from pipeline.row_preparation import PreparedRow
from pipeline.row_requests import RowGroup, SubRequest
from pipeline.shard_engine import ShardEngine

if TYPE_CHECKING:
    from pipeline.shard_opening import OpenShard

log = logging.getLogger(__name__)


@dataclass
class InFlight:
    """One engine request: whose row it is, and its place among the row's requests."""

    shard: OpenShard
    row: PreparedRow
    admitted_at: float
    group: RowGroup  # the row's requests (one, or one per answer choice)
    index: int = 0  # this request's place in the group


class InFlightRequests:
    def __init__(self, engine: ShardEngine, nonce: str) -> None:
        self.engine, self.nonce = engine, nonce
        self._by_id: dict[str, InFlight] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def shards(self) -> list[OpenShard]:
        """The shards with rows in the engine."""
        return list({id(i.shard): i.shard for i in self._by_id.values()}.values())

    def add(self, shard: OpenShard, row: PreparedRow, subs: list[SubRequest]) -> str | None:
        """Queue the row's requests; if the engine refuses one, none stays queued and the row's error is returned."""
        record = row.record
        base = f"{self.nonce}:{shard.ref.index}:{record.row_number}"
        rids = [base] if len(subs) == 1 else [f"{base}#{i}" for i in range(len(subs))]
        group, now = RowGroup(subs), time.perf_counter()
        for i, (rid, sub) in enumerate(zip(rids, subs, strict=True)):
            try:
                self.engine.add_request(rid, sub.token_ids, sub.params)
            except Exception as exc:  # RequestError names the problem; anything else is an engine bug
                for queued in rids[:i]:  # the row's requests already queued
                    self.drop(queued)
                if isinstance(exc, RequestError):
                    return f"row {record.row_number}: {exc.reason}" if exc.request_id == rid else str(exc)
                log.exception("add_request failed for row %d", record.row_number)
                return f"row {record.row_number}: cannot queue the request: {type(exc).__name__}: {exc}"
            self._by_id[rid] = InFlight(shard, row, now, group, i)
            shard.in_flight.add(rid)
        return None

    def finished(self, out: RequestOutput) -> InFlight | None:
        """Record a finished request; its row's entry once every request of the row has finished."""
        inf = self._by_id.pop(out.request_id, None)
        if inf is None:  # dropped meanwhile (its shard failed or was cancelled)
            return None
        inf.shard.in_flight.discard(out.request_id)
        inf.group.outputs[inf.index] = out
        return inf if inf.group.done else None

    def drop(self, rid: str) -> None:
        """Abort a request and forget it."""
        self.abort(rid)
        inf = self._by_id.pop(rid, None)
        if inf is not None:
            inf.shard.in_flight.discard(rid)

    def drop_shard(self, shard: OpenShard) -> None:
        for rid in list(shard.in_flight):
            self.drop(rid)
        shard.in_flight.clear()

    def drop_all(self) -> list[InFlight]:
        """Abort every request; returns one entry per row that was in the engine."""
        rows: dict[int, InFlight] = {}
        for rid, inf in list(self._by_id.items()):
            self.drop(rid)
            rows.setdefault(id(inf.group), inf)
        return list(rows.values())

    def abort(self, rid: str) -> None:
        try:
            self.engine.abort_request(rid)
        except Exception as exc:  # the engine may be the thing that is broken
            log.warning("could not abort request %s: %s", rid, exc)

    def abort_everything(self) -> None:
        """Empty the engine, whoever's requests it holds (a run that died half-way may have left some)."""
        try:
            self.engine.abort_all()
        except Exception as exc:  # the engine may be the thing that is broken
            log.warning("could not abort the engine's requests: %s", exc)
