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

This module only drives: admit rows, step the engine, hand its outputs to the kind and the
rows to the shard's sink. A row's way through the engine (prepared, tracked, shared, shaped) is
``pipeline.row_flow.RowFlow``; it reaches the part through ``pipeline.part_sink``. What the
caller hands in besides engine and plan is ``pipeline.shard_hooks.ShardHooks``. The engine is
anything with the members of ``pipeline.shard_engine.ShardEngine``.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Generator, Iterable, Iterator

from connectors import ShardRef
from engine import RequestOutput
from pipeline.part_sink import SPOOL_ROWS
from pipeline.plan import JobPlan
from pipeline.prompts import validate_prompt
from pipeline.result_row import RequestResult, ResultRow
from pipeline.row_flow import RowFlow
from pipeline.row_preparation import PreparedRow
from pipeline.shard_engine import ShardEngine
from pipeline.shard_feed import ListFeed, ShardFeed
from pipeline.shard_hooks import ShardHooks
from pipeline.shard_opening import OpenShard, ShardEnd, open_shard
from pipeline.shard_outcome import ShardOutcome, ShardState
from pipeline.shard_reports import ProgressCallback

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
        self.max_queued = max_queued or 2 * engine.config.max_num_seqs
        self.max_held, self.read_batch = self.max_queued + HELD_ROWS, max(1, min(256, self.max_queued))
        self.hooks = ShardHooks.build(on_progress=on_progress, should_stop=should_stop, worker=worker,
                                      hand_back=hand_back, engine_factory=engine_factory, on_step=on_step)
        self.rows = RowFlow.build(plan, engine, self._complete)
        self.in_flight, self.stop_poll = self.rows.in_flight, self.hooks.stop_poll  # (never replaced)

    @property
    def engine(self) -> ShardEngine:
        return self.rows.engine

    @property
    def on_progress(self) -> ProgressCallback | None:
        return self.hooks.reports.on_progress

    @on_progress.setter
    def on_progress(self, callback: ProgressCallback | None) -> None:
        """Set after construction too (the embedded runner's progress bar)."""
        self.hooks.reports.on_progress = callback

    # ---- the loop: admit, step, hand outputs to the kind and rows to the sink -------------
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
                more = yield from self._admit(opened, feed, more)
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

    def _admit(self, opened: list[OpenShard], feed: ShardFeed, more: bool) -> Generator[ShardOutcome, None, bool]:
        """Fill the engine up to ``max_queued`` requests with rows of the shard being read,
        opening the next shard when its reader runs dry (and yielding the outcomes of shards
        that end meanwhile). Returns whether the feed may still have shards."""
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
                yield from self._open(ref, opened)
                continue
            if not self._admit_next(reader):
                break  # the reader holds its limit of rows: step until its oldest finishes
        return more

    def _open(self, ref: ShardRef, opened: list[OpenShard]) -> Iterator[ShardOutcome]:
        """Open a shard's reader and part, or yield its outcome if it ends here (current, unreadable)."""
        started = time.perf_counter()
        shard = open_shard(self.plan, ref, self.rows.schema, self.read_batch)
        if isinstance(shard, ShardEnd):
            yield self.hooks.reports.outcome(self.engine, ref, shard.state, started, shard.counts, shard.reason,
                                             shard.transient, part_commit=shard.part_commit)
        else:
            opened.append(shard)
            self.hooks.reports.notify(shard.progress)

    def _finish_ready(self, opened: list[OpenShard]) -> Iterator[ShardOutcome]:
        """Commit every open shard that is fully read and has nothing left in the engine."""
        for shard in [s for s in opened if s.exhausted and not s.in_flight]:
            opened.remove(shard)
            shard.sink.commit()
            if shard.sink.failed is not None:
                yield self.hooks.reports.outcome(self.engine, shard.ref, ShardState.FAILED, shard.started, None,
                                           shard.sink.failed, shard.sink.transient)
            else:
                yield self.hooks.reports.outcome(self.engine, shard.ref, ShardState.DONE, shard.started, shard.sink.counts,
                                           shard=shard)

    def _cancel_all(self, opened: list[OpenShard], feed: ShardFeed) -> Iterator[ShardOutcome]:
        handing_back = self.hooks.handing_back()
        for shard in opened:
            reason = "job cancelled"
            if handing_back:
                self.in_flight.drop_shard(shard)  # rows in flight are lost; every finished one is kept
                saved = shard.sink.save_checkpoint()
                reason = f"handed back, its first {saved} rows checkpointed" if shard.sink.checkpoint else "handed back"
                log.warning("shard %d: %s", shard.ref.index, reason)
            self._fail_shard(shard, "cancelled", transient=False)
            yield self.hooks.reports.outcome(self.engine, shard.ref, ShardState.CANCELLED, shard.started, reason=reason)
        while (ref := feed.next_shard(wait=False)) is not None:
            yield self.hooks.reports.outcome(self.engine, ref, ShardState.CANCELLED, time.perf_counter(),
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
        failure = shard.read_next(self.rows.preparation)
        if failure is not None:
            self._fail_shard(shard, failure.reason, failure.transient)
        return True

    def _admit_row(self, shard: OpenShard, row: PreparedRow) -> None:
        """Into the engine, unless the row takes an earlier result or is an error row."""
        requests = self.rows.preparation.requests(row)
        error = requests.error if requests.error is not None else self.rows.sharing.admit(shard, row, requests.subs)
        if error is not None:
            result = RequestResult(error=error, prompt_tokens=requests.prompt_tokens)
            self._complete(shard, row, self.rows.results.build(row.record, result, content_key=row.key))

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
        """Step the engine, hand its outputs to the kind and the rows to the sink."""
        outputs = self._step_engine()
        if outputs is not None:
            self._hand_out(outputs)

    def _step_engine(self) -> list[RequestOutput] | None:
        """One engine step; None after a fault that was no single request's (the shards with rows
        in the engine failed, the engine rebuilt)."""
        if not self.engine.has_unfinished():  # cannot happen unless the engine lost requests
            self._fail_in_flight("the engine dropped the request")
            return None
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
            return None
        if self.hooks.on_step is not None:
            self.hooks.on_step(self.engine, time.perf_counter() - started)
        return outputs

    def _hand_out(self, outputs: list[RequestOutput]) -> None:
        """Each finished row's outputs to the kind (its values), then its result row to the sink."""
        touched: dict[int, OpenShard] = {}
        for out in outputs:
            inf = self.in_flight.finished(out)
            if inf is None:
                continue
            result, row, now = self.rows.result_row(inf)
            self._complete(inf.shard, inf.row, row, notify=False)
            for shard in (inf.shard, *self.rows.sharing.fan_out(inf, result, now)):  # identical rows take it too
                touched[shard.ref.index] = shard
        for shard in touched.values():
            self.hooks.reports.notify(shard.progress)

    def _replace_engine(self) -> None:
        """A fresh engine from ``engine_factory``; without one, this engine emptied of requests."""
        if self.hooks.engine_factory is None:
            self.in_flight.abort_everything()
            return
        # Let go of the old engine first: the factory may free it (and its KV pool) before
        # building the new one, and must not see it still held here.
        self.rows.use_engine(None)
        self.rows.use_engine(self.hooks.engine_factory())

    def _fail_in_flight(self, message: str) -> None:
        """Every row in the engine becomes an error row; the engine is left empty."""
        for inf, row in self.rows.drop_all_as_errors(message):
            self._complete(inf.shard, inf.row, row)

    # ---- rows and outcomes --------------------------------------------------------------
    def _complete(self, shard: OpenShard, prepared: PreparedRow, row: ResultRow, notify: bool = True) -> None:
        """Run the kind's row stage, then hand the row to the shard's part."""
        if shard.sink.failed is not None:  # its part is abandoned (e.g. a spool write failed)
            return
        shard.sink.add(prepared.position, self.rows.results.finish(prepared.record, row))
        if not self._closed_by_sink(shard) and notify:
            self.hooks.reports.notify(shard.progress)
