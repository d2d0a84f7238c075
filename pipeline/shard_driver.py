"""Streams shards' records through one engine and writes one output part per shard.

The engine is kept full across shard boundaries: as soon as the current shard's
reader is exhausted, the next shard is opened and its rows are admitted while the
current shard's last requests still decode, so the batch never drains to a handful of
stragglers between shards. Memory stays bounded: at most ``max_queued`` requests sit in
the engine, at most one read batch waits for admission, and a shard holds at most
``max_held`` rows read but not yet in its part file, whatever its mix of good and bad
rows (error rows never enter the engine, and rows reach the part only in input order, so
without that bound one slow first row would hold back everything read after it).

Rows in == rows out: a bad input row, a prompt the engine refuses, a template error,
a failing row stage or an engine fault each become an output row with ``error`` set.
A shard that cannot be read at all is reported ``failed`` and writes no part.

This module only drives (feed, admission, steps, faults, cancelling): rows become
requests in ``pipeline.row_preparation``, a row that need not be computed (an unchanged
row of the previous part, or one identical to a row of this run) takes its result through
``pipeline.row_sharing``, requests are tracked in ``pipeline.in_flight``, finished rows
take their shape in ``pipeline.result_rows`` and reach the part through
``pipeline.part_sink``; progress and outcomes go out through ``pipeline.shard_reports``.
The engine is anything with the members of ``pipeline.shard_engine.ShardEngine``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator

from connectors import ShardRef
from pipeline.in_flight import InFlightRequests
from pipeline.output_schema import output_schema
from pipeline.part_sink import SPOOL_ROWS
from pipeline.plan import JobPlan
from pipeline.prompts import validate_prompt
from pipeline.result_rows import ResultRows
from pipeline.row_preparation import PreparedRow, RowPreparation
from pipeline.row_requests import RequestBuilder
from pipeline.row_sharing import RowSharing
from pipeline.shard_engine import ShardEngine
from pipeline.shard_feed import ListFeed, ShardFeed
from pipeline.shard_opening import OpenShard, ShardEnd, open_shard
from pipeline.shard_outcome import ShardOutcome, ShardState
from pipeline.shard_reports import ProgressCallback, ShardReports
from pipeline.stop_poll import StopPoll

log = logging.getLogger(__name__)

# Shards open at once: one being read, the rest waiting for their last requests to finish.
MAX_OPEN_SHARDS = 8
# Rows a shard may hold read but not spooled, beyond what the engine holds: reading stops
# there until the row that holds the others back finishes.
HELD_ROWS = 2 * SPOOL_ROWS


class ShardDriver:
    """``ShardDriver(engine, plan).run(shards)`` yields a ShardOutcome per shard as each ends.

    ``cross_shard=False`` drains the engine between shards (benchmarks only: what this class exists to
    avoid). ``should_stop`` is polled about once a second; when it returns True the open shards are aborted
    and every shard not yet finished comes back ``cancelled``. ``engine_factory`` builds a fresh engine
    after a step fault that was no single request's (the shards it held fail, transiently). ``on_step``
    (metrics) is called with the engine and each step's seconds. ``hand_back`` is asked when a stop is
    requested: True (the worker is shutting down, the shards go back to the queue) checkpoints every open
    shard's finished rows before it is dropped, so whoever takes it next starts after them.
    """

    def __init__(
        self,
        engine: ShardEngine,
        plan: JobPlan,
        *,
        cross_shard: bool = True,
        max_queued: int | None = None,
        on_progress: ProgressCallback | None = None,
        should_stop: Callable[[], bool] | None = None,
        engine_factory: Callable[[], ShardEngine] | None = None,
        worker: str | None = None,
        on_step: Callable[[ShardEngine, float], None] | None = None,
        hand_back: Callable[[], bool] | None = None,
    ) -> None:
        validate_prompt(plan.prompt)
        self.plan, self.cross_shard = plan, cross_shard
        self.engine_factory, self.hand_back, self.on_step = engine_factory, hand_back, on_step
        self.max_queued = max_queued or 2 * engine.config.max_num_seqs
        self.max_held, self.read_batch = self.max_queued + HELD_ROWS, max(1, min(256, self.max_queued))
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}"
        self.reports = ShardReports(on_progress, self.worker)
        self.schema = output_schema(plan)
        self.in_flight = InFlightRequests(engine, uuid.uuid4().hex[:8])
        self._use_engine(engine)
        self.results = ResultRows(plan, self.schema)
        self.sharing = RowSharing(plan, self.in_flight, self.results, self._complete)
        self.stop_poll = StopPoll(should_stop)  # should_stop may ask Redis: not at every step

    @property
    def on_progress(self) -> ProgressCallback | None:
        return self.reports.on_progress

    @on_progress.setter
    def on_progress(self, callback: ProgressCallback | None) -> None:
        """Set after construction too (the embedded runner's progress bar)."""
        self.reports.on_progress = callback

    def _use_engine(self, engine: ShardEngine) -> None:
        self.engine = engine
        self.in_flight.use_engine(engine)
        self.request_builder = RequestBuilder(self.plan, engine)
        self.preparation = RowPreparation(self.plan, engine, self.request_builder)

    # ---- the loop -----------------------------------------------------------------------
    def run(self, shards: Iterable[ShardRef] | ShardFeed) -> Iterator[ShardOutcome]:
        """Run ``shards`` in order, overlapping each shard's tail with the next's head.

        ``shards`` may be a live ``ShardFeed``: the engine keeps stepping while it has
        nothing new, and the run ends when the feed is closed and every shard is written.
        """
        self.in_flight.abort_everything()  # a previous run on this engine may have died half-way
        feed: ShardFeed = shards if hasattr(shards, "next_shard") else ListFeed(shards)
        opened: list[OpenShard] = []
        more = True
        try:
            while True:
                if self.stop_poll():
                    yield from self._cancel_all(opened, feed)
                    return
                while len(self.in_flight) < self.max_queued:
                    reader = opened[-1] if opened and not opened[-1].exhausted else None
                    if reader is None:
                        yield from self._finish_ready(opened)
                        if not more or len(opened) >= MAX_OPEN_SHARDS or (opened and not self.cross_shard):
                            break
                        ref = feed.next_shard(wait=not self.in_flight and not opened)
                        if ref is None:
                            more = not feed.closed
                            break
                        started = time.perf_counter()
                        shard = open_shard(self.plan, ref, self.schema, self.read_batch)
                        if isinstance(shard, ShardEnd):
                            yield self.reports.outcome(self.engine, ref, shard.state, started, shard.counts,
                                                       shard.reason, shard.transient, part_commit=shard.part_commit)
                        else:
                            opened.append(shard)
                            self.reports.notify(shard.progress)
                        continue
                    if not self._admit_next(reader):
                        break  # the reader holds its limit of rows: step until its oldest finishes
                yield from self._finish_ready(opened)
                if not opened and not more:
                    return
                for orphan in self.in_flight.take_orphans():  # the row they followed was dropped
                    self._admit_row(orphan.shard, orphan.row)
                if self.in_flight:
                    self._step()
        finally:
            self.in_flight.drop_all()  # closed early (error, consumer stopped): leave no work behind
            for shard in opened:
                shard.sink.discard()

    def _finish_ready(self, opened: list[OpenShard]) -> Iterator[ShardOutcome]:
        """Commit every open shard that is fully read and has nothing left in the engine."""
        for shard in [s for s in opened if s.exhausted and not s.in_flight]:
            opened.remove(shard)
            shard.sink.commit()
            if shard.sink.failed is not None:
                yield self.reports.outcome(self.engine, shard.ref, ShardState.FAILED, shard.started, None,
                                           shard.sink.failed, shard.sink.transient)
            else:
                yield self.reports.outcome(self.engine, shard.ref, ShardState.DONE, shard.started, shard.sink.counts,
                                           shard=shard)

    def _cancel_all(self, opened: list[OpenShard], feed: ShardFeed) -> Iterator[ShardOutcome]:
        handing_back = self.hand_back is not None and self.hand_back()
        for shard in opened:
            reason = "job cancelled"
            if handing_back:
                self.in_flight.drop_shard(shard)  # rows in flight are lost; every finished one is kept
                saved = shard.sink.save_checkpoint()
                reason = f"handed back, its first {saved} rows checkpointed" if shard.sink.checkpoint else "handed back"
                log.warning("shard %d: %s", shard.ref.index, reason)
            self._fail_shard(shard, "cancelled", transient=False)
            yield self.reports.outcome(self.engine, shard.ref, ShardState.CANCELLED, shard.started, reason=reason)
        while (ref := feed.next_shard(wait=False)) is not None:
            yield self.reports.outcome(self.engine, ref, ShardState.CANCELLED, time.perf_counter(),
                                       reason="job cancelled")

    # ---- admission ----------------------------------------------------------------------
    def _admit_next(self, shard: OpenShard) -> bool:
        """Admit one buffered row, or read the next batch into the buffer. False (nothing done)
        while the shard holds ``max_held`` unspooled rows and some of them are in the engine."""
        if shard.buffer:
            self._admit_row(shard, shard.buffer.popleft())
            return True
        if shard.held >= self.max_held:
            if shard.in_flight:
                return False
            shard.sink.spool()  # nothing in the engine: every held row is finished, in order
            if self._closed_by_sink(shard):
                return True
        failure = shard.read_next(self.preparation)
        if failure is not None:
            self._fail_shard(shard, *failure)
        return True

    def _admit_row(self, shard: OpenShard, row: PreparedRow) -> None:
        """Into the engine, unless the row takes an earlier result or is an error row."""
        requests = self.preparation.requests(row)
        error = requests.error if requests.error is not None else self.sharing.admit(shard, row, requests.subs)
        if error is not None:
            self._complete(shard, row, self.results.build(row.record, error=error,
                                                          prompt_tokens=requests.prompt_tokens, content_key=row.key))

    def _fail_shard(self, shard: OpenShard, reason: str, transient: bool) -> None:
        shard.sink.abandon(reason, transient=transient)
        self._closed_by_sink(shard)

    def _closed_by_sink(self, shard: OpenShard) -> bool:
        """True (and the shard's reading and requests stopped) if its part was abandoned."""
        if shard.sink.failed is not None:
            self.in_flight.drop_shard(shard)
            shard.stop_reading()
        return shard.sink.failed is not None

    # ---- stepping -----------------------------------------------------------------------
    def _step(self) -> None:
        if not self.engine.has_unfinished():  # cannot happen unless the engine lost requests
            self._fail_in_flight("the engine dropped the request")
            return
        started = time.perf_counter()
        reason = None
        try:
            outputs = self.engine.step()
        except Exception as exc:
            # Not one request's fault (the engine isolates those): its state is unknown. Every
            # shard with rows in it fails (transient: the fleet retries it), then the engine is
            # rebuilt and the run goes on with the shards that had nothing in it.
            # the traceback as text: a log record holding the exception would hold the engine
            log.error("engine step failed; failing the shards in it and rebuilding the engine\n%s",
                      traceback.format_exc())
            reason = f"engine failed: {type(exc).__name__}: {exc}"
        if reason is not None:  # out of the except block: its traceback no longer holds the engine
            for shard in self.in_flight.shards():
                self._fail_shard(shard, reason, transient=True)
            self._fail_in_flight(reason)
            self._replace_engine()
            return
        if self.on_step is not None:
            self.on_step(self.engine, time.perf_counter() - started)
        touched: dict[int, OpenShard] = {}
        for out in outputs:
            inf = self.in_flight.finished(out)
            if inf is None:
                continue
            record = inf.row.record
            try:
                values = self.request_builder.row_values(inf.group)
            except Exception as exc:  # scoring a finished row must cost the row only
                log.exception("cannot build the result of row %d", record.row_number)
                values = {"error": f"row {record.row_number}: {type(exc).__name__}: {exc}"}
            now = time.perf_counter()
            row = self.results.build(record, **values, latency_s=now - inf.admitted_at, content_key=inf.row.key)
            self._complete(inf.shard, inf.row, row, notify=False)
            for shard in (inf.shard, *self.sharing.fan_out(inf, values, now)):  # identical rows take it too
                touched[shard.ref.index] = shard
        for shard in touched.values():
            self.reports.notify(shard.progress)

    def _replace_engine(self) -> None:
        """A fresh engine from ``engine_factory``; without one, this engine emptied of requests."""
        if self.engine_factory is None:
            self.in_flight.abort_everything()
            return
        # Let go of the old engine first: the factory may free it (and its KV pool) before
        # building the new one, and must not see it still held here.
        self.engine = self.request_builder = self.preparation = None  # type: ignore[assignment]
        self.in_flight.use_engine(None)  # type: ignore[arg-type]
        self._use_engine(self.engine_factory())

    def _fail_in_flight(self, message: str) -> None:
        """Every row in the engine becomes an error row; the engine is left empty."""
        for inf in self.in_flight.drop_all():
            record = inf.row.record
            row = self.results.build(record, error=f"row {record.row_number}: {message}",
                                     latency_s=time.perf_counter() - inf.admitted_at)
            self._complete(inf.shard, inf.row, row)

    # ---- rows and outcomes --------------------------------------------------------------
    def _complete(self, shard: OpenShard, prepared: PreparedRow, row: dict, notify: bool = True) -> None:
        """Run the kind's row stage, then hand the row to the shard's part."""
        if shard.sink.failed is not None:  # its part is abandoned (e.g. a spool write failed)
            return
        openai_line = self.results.finish(prepared.record, row)
        shard.sink.add(prepared.position, row, openai_line)
        if not self._closed_by_sink(shard) and notify:
            self.reports.notify(shard.progress)
