"""The requests a driver has in the engine, and whose rows they are.

A row becomes one request, or several (one per answer choice when scoring); it is
finished when all of its requests are. Request ids are ``<nonce>:<shard>:<row>`` (plus
``#<i>`` per choice), unique per driver so two runs on one engine never collide.

A row added with a content key that a row in the engine already computes does not enter
the engine: it follows that row (its shard holds a placeholder id ``...~`` meanwhile, so the
shard is not committed without it) and gets its result. If the leading row is dropped (its
shard failed or was handed back), its followers become ``orphans`` for the driver to admit
again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine import RequestError, RequestOutput
from pipeline.row_preparation import PreparedRow
from pipeline.shard_engine import ShardEngine
from pipeline.sub_requests import RowGroup, SubRequest

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


@dataclass
class Follower:
    """A row waiting for the result of an identical row in the engine."""

    shard: OpenShard
    row: PreparedRow
    admitted_at: float
    rid: str  # its placeholder in the shard's in_flight


class InFlightRequests:
    def __init__(self, engine: ShardEngine, nonce: str) -> None:
        self.engine, self.nonce = engine, nonce
        self._by_id: dict[str, InFlight] = {}
        self._leaders: dict[str, RowGroup] = {}  # content key -> the group computing it
        self._followers: dict[int, list[Follower]] = {}  # id(leading group) -> rows waiting for it
        self.orphans: list[Follower] = []  # followers whose leader was dropped: to be admitted again

    def use_engine(self, engine: ShardEngine) -> None:
        """Send later requests to ``engine`` (the driver switched engines between runs)."""
        self.engine = engine

    def __len__(self) -> int:
        return len(self._by_id)

    def shards(self) -> list[OpenShard]:
        """The shards with rows in the engine."""
        return list({id(i.shard): i.shard for i in self._by_id.values()}.values())

    def add(self, shard: OpenShard, row: PreparedRow, subs: list[SubRequest], key: str | None = None) -> str | None:
        """Queue the row's requests (or, with a ``key`` a row in the engine has, make it follow that
        row); if the engine refuses one, none stays queued and the row's error is returned."""
        record = row.record
        base = f"{self.nonce}:{shard.ref.index}:{record.row_number}"
        now = time.perf_counter()
        leader = self._leaders.get(key) if key is not None else None
        if leader is not None:
            self._followers[id(leader)].append(Follower(shard, row, now, f"{base}~"))
            shard.in_flight.add(f"{base}~")
            return None
        rids = [base] if len(subs) == 1 else [f"{base}#{i}" for i in range(len(subs))]
        group = RowGroup(subs, key=key)
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
        if key is not None:
            self._leaders[key] = group
            self._followers[id(group)] = []
        return None

    def finished(self, out: RequestOutput) -> InFlight | None:
        """Record a finished request; its row's entry once every request of the row has finished."""
        inf = self._by_id.pop(out.request_id, None)
        if inf is None:  # dropped meanwhile (its shard failed or was cancelled)
            return None
        inf.shard.in_flight.discard(out.request_id)
        inf.group.outputs[inf.index] = out
        return inf if inf.group.done else None

    def release_followers(self, group: RowGroup) -> list[Follower]:
        """The rows that followed a finished group (their placeholders removed), but not those of
        shards that failed meanwhile."""
        if group.key is not None and self._leaders.get(group.key) is group:
            del self._leaders[group.key]
        followers = self._followers.pop(id(group), [])
        for f in followers:
            f.shard.in_flight.discard(f.rid)
        return [f for f in followers if f.shard.sink.failed is None]

    def take_orphans(self) -> list[Follower]:
        """Followers whose leader was dropped, placeholders removed, for their rows to be admitted again."""
        orphans, self.orphans = self.orphans, []
        for f in orphans:
            f.shard.in_flight.discard(f.rid)
        return [f for f in orphans if f.shard.sink.failed is None]

    def drop(self, rid: str) -> None:
        """Abort a request and forget it; a leading row's followers become orphans."""
        if rid.endswith("~"):  # a follower's placeholder: nothing in the engine
            return
        self.abort(rid)
        inf = self._by_id.pop(rid, None)
        if inf is not None:
            inf.shard.in_flight.discard(rid)
            group = inf.group
            if group.key is not None and self._leaders.get(group.key) is group:
                del self._leaders[group.key]
                self.orphans += self._followers.pop(id(group), [])

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
