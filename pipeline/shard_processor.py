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
a failing row hook or an engine fault each become an output row with ``error`` set.
A shard that cannot be read at all is reported ``failed`` and writes no part.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from connectors import (
    PartWriter,
    Record,
    ShardReadError,
    ShardRef,
    is_transient,
    join_url,
    part_is_current,
    read_records,
    write_text,
)
from engine import LLMEngine, RequestError
from pipeline.hooks import RowRejected, load_hook
from pipeline.openai_output import OPENAI_LINE_KEY, jsonl_name, lines_to_jsonl, openai_line
from pipeline.output_columns import empty_result
from pipeline.output_schema import coerce_extra, output_schema, passthrough_value, rows_to_table
from pipeline.part_info import read_part_result, result_metadata
from pipeline.plan import JobPlan
from pipeline.prompts import TemplateError, prefix_key, render_messages, validate_prompt
from pipeline.row_requests import RequestBuilder, RowGroup, RowInputError
from pipeline.shard_result import ShardResult

log = logging.getLogger(__name__)

# Shards open at once: one being read, the rest waiting for their last requests to finish.
MAX_OPEN_SHARDS = 8
# Finished rows are appended to the shard's part file in input order once this many are
# waiting, so a million-row shard holds a few thousand rows in memory, not a million.
SPOOL_ROWS = 2048
# Rows a shard may hold read but not spooled, beyond what the engine holds: reading stops
# there until the row that holds the others back finishes.
HELD_ROWS = 2 * SPOOL_ROWS


@dataclass
class ShardProgress:
    """A running shard's counters, handed to the progress callback as they change."""

    index: int
    url: str
    state: str  # running | done | skipped | failed | cancelled
    rows_done: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_prompt_tokens: int = 0
    started_at: float = field(default_factory=time.time)
    reason: str | None = None
    transient: bool = False  # a failure that a retry of the shard may not hit


ProgressCallback = Callable[[ShardProgress], None]


class ShardFeed(Protocol):
    """A source of shards that may not all be known yet (a worker's incoming shard tasks).

    ``next_shard(wait)`` returns the next shard, or None when there is none right now;
    with ``wait`` (the engine is idle) it may block briefly for one. ``closed`` is True
    once no more shards will come.
    """

    def next_shard(self, wait: bool) -> ShardRef | None: ...

    @property
    def closed(self) -> bool: ...


class _ListFeed:
    """A known list of shards as a feed."""

    def __init__(self, shards: Iterable[ShardRef]) -> None:
        self._shards = iter(shards)
        self.closed = False

    def next_shard(self, wait: bool) -> ShardRef | None:
        ref = next(self._shards, None)
        self.closed = ref is None
        return ref


@dataclass
class _Pending:
    """A read record waiting for admission, with its messages (or why it has none)."""

    record: Record
    seq: int  # position in the shard as read: the row's place in the part
    messages: list[dict[str, str]] | None
    error: str | None


@dataclass
class _InFlight:
    shard: _OpenShard
    record: Record
    seq: int
    admitted_at: float
    group: RowGroup  # the row's requests (one, or one per answer choice)
    index: int = 0  # this request's place in the group


@dataclass
class _OpenShard:
    ref: ShardRef
    batches: Iterator[list[Record]]
    progress: ShardProgress
    started: float = field(default_factory=time.perf_counter)
    buffer: deque[_Pending] = field(default_factory=deque)
    exhausted: bool = False
    failed: str | None = None
    transient: bool = False
    cancelled: bool = False
    in_flight: set[str] = field(default_factory=set)
    rows_read: int = 0
    rows_spooled: int = 0  # rows [0, rows_spooled) are in the part writer
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)  # seq -> finished row not yet spooled
    openai_lines: dict[int, dict[str, Any]] = field(default_factory=dict)
    writer: PartWriter | None = None
    cached_prompt_tokens: int = 0


class ShardProcessor:
    """``ShardProcessor(engine, plan).run(shards)`` yields a ShardResult per shard as each completes.

    ``cross_shard=False`` drains the engine between shards (for benchmarks: the
    behaviour this class exists to avoid). ``should_stop`` is polled about once a
    second; when it returns True the open shards are aborted and every shard not yet
    finished comes back ``cancelled``. ``engine_factory`` builds a fresh engine after
    a step fault that was no single request's (the shards it held fail, transiently).
    """

    def __init__(
        self,
        engine: LLMEngine,
        plan: JobPlan,
        *,
        cross_shard: bool = True,
        max_queued: int | None = None,
        on_progress: ProgressCallback | None = None,
        should_stop: Callable[[], bool] | None = None,
        engine_factory: Callable[[], LLMEngine] | None = None,
        worker: str | None = None,
        on_step: Callable[[LLMEngine, float], None] | None = None,
    ) -> None:
        validate_prompt(plan.prompt)
        self.on_step = on_step  # metrics: called with the engine and the step's seconds
        self.engine = engine
        self.plan = plan
        self.cross_shard = cross_shard
        self.max_queued = max_queued or 2 * engine.config.max_num_seqs
        self.max_held = self.max_queued + HELD_ROWS
        self.read_batch = max(1, min(256, self.max_queued))
        self.on_progress = on_progress
        self.should_stop = should_stop
        self.engine_factory = engine_factory
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}"
        self.schema = output_schema(plan)
        self.requests = RequestBuilder(plan, engine)
        self.sampling = self.requests.params
        self.hook = load_hook(plan.row_hook) if plan.row_hook else None
        self.extra_types = {f.name: f.type for f in self.schema if f.name in plan.extra_columns}
        self._in_flight: dict[str, _InFlight] = {}
        self._nonce = uuid.uuid4().hex[:8]
        self._last_stop_check = 0.0

    # ---- driving ----------------------------------------------------------------------
    def process_shard(self, shard: ShardRef) -> dict[str, Any]:
        """One shard, start to finish: its ShardResult dict."""
        (result,) = list(self.run([shard]))
        return result

    def run(self, shards: Iterable[ShardRef] | ShardFeed) -> Iterator[dict[str, Any]]:
        """Process ``shards`` in order, overlapping each shard's tail with the next's head.

        ``shards`` may be a live ``ShardFeed``: the engine keeps stepping while it has
        nothing new, and the run ends when the feed is closed and every shard is written.
        """
        self._abort_leftovers()
        feed: ShardFeed = shards if hasattr(shards, "next_shard") else _ListFeed(shards)
        opened: list[_OpenShard] = []
        more = True
        try:
            while True:
                if self._stop_requested():
                    yield from self._cancel_all(opened, feed)
                    return
                while len(self._in_flight) < self.max_queued:
                    reader = opened[-1] if opened and not opened[-1].exhausted else None
                    if reader is None:
                        yield from self._finish_ready(opened)
                        if not more or len(opened) >= MAX_OPEN_SHARDS or (opened and not self.cross_shard):
                            break
                        ref = feed.next_shard(wait=not self._in_flight and not opened)
                        if ref is None:
                            more = not feed.closed
                            break
                        state = self._open(ref)
                        if isinstance(state, dict):
                            yield state
                        else:
                            opened.append(state)
                        continue
                    if not self._admit_next(reader):
                        break  # the reader holds its limit of rows: step until its oldest finishes
                yield from self._finish_ready(opened)
                if not opened and not more:
                    return
                if self._in_flight:
                    self._step()
        finally:
            for rid in list(self._in_flight):  # closed early (error, consumer stopped): leave no work behind
                self._abort(rid)
            self._in_flight.clear()
            for shard in opened:
                if shard.writer is not None:
                    shard.writer.abort()

    def _finish_ready(self, opened: list[_OpenShard]) -> Iterator[dict[str, Any]]:
        """Write out every open shard that is fully read and has nothing left in the engine."""
        for shard in [s for s in opened if s.exhausted and not s.in_flight]:
            opened.remove(shard)
            yield self._finish(shard)

    def _abort_leftovers(self) -> None:
        """A previous run on this engine that died half-way may have left requests queued."""
        for rid in list(getattr(self.engine, "sequences", {})):
            self._abort(rid)

    def _abort(self, rid: str) -> None:
        try:
            self.engine.abort_request(rid)
        except Exception as exc:  # the engine may be the thing that is broken
            log.warning("could not abort request %s: %s", rid, exc)

    def _stop_requested(self) -> bool:
        if self.should_stop is None:
            return False
        now = time.monotonic()
        if now - self._last_stop_check < 1.0:
            return False
        self._last_stop_check = now
        try:
            return bool(self.should_stop())
        except Exception as exc:
            log.warning("cancel check failed, carrying on: %s", exc)
            return False

    # ---- opening and reading -----------------------------------------------------------
    def _open(self, ref: ShardRef) -> _OpenShard | dict[str, Any]:
        """An open shard, or a finished result for a shard that is current, cancelled or unreadable."""
        plan = self.plan
        started = time.perf_counter()
        try:
            current = part_is_current(
                plan.output_url, ref.part_id, plan.part_fingerprint(ref.fingerprint), plan.output_options
            )
        except Exception as exc:  # cannot tell: process it; a real storage problem shows at write time
            log.warning("cannot check part %s of %s: %s", ref.part_id, plan.job_id, exc)
            current = False
        if current:
            counts = read_part_result(plan.output_url, ref.part_id, plan.output_options)
            return self._result(ref, "skipped", started, reason="part already current", **counts)
        progress = ShardProgress(ref.index, ref.url, "running")
        try:
            batches = read_records(
                ref,
                text_field=plan.text_field,
                id_field=plan.id_field,
                batch_size=self.read_batch,
                storage_options=plan.storage_options,
            )
        except ShardReadError as exc:
            return self._result(ref, "failed", started, reason=str(exc))
        except Exception as exc:
            return self._result(
                ref, "failed", started, reason=f"{type(exc).__name__}: {exc}", transient=is_transient(exc)
            )
        self._notify(progress)
        return _OpenShard(ref, batches, progress)

    def _admit_next(self, shard: _OpenShard) -> bool:
        """Admit one buffered row, or read the next batch into the buffer. False (nothing done)
        while the shard holds ``max_held`` unspooled rows and some of them are in the engine."""
        if shard.buffer:
            self._submit(shard, shard.buffer.popleft())
            return True
        if shard.rows_read - shard.rows_spooled >= self.max_held:
            if shard.in_flight:
                return False
            self._spool(shard)  # nothing in the engine: every held row is finished, in order
            if shard.failed is not None:
                return True
        try:
            batch = next(shard.batches)
        except StopIteration:
            shard.exhausted = True
            return True
        except ShardReadError as exc:
            self._fail_shard(shard, str(exc), transient=False)
            return True
        except Exception as exc:
            self._fail_shard(shard, f"{type(exc).__name__}: {exc}", transient=is_transient(exc))
            return True
        shard.buffer.extend(self._ordered(shard, batch))
        return True

    def _ordered(self, shard: _OpenShard, batch: list[Record]) -> list[_Pending]:
        """Rows sharing all turns but the last go in together (prefix-cache hits), groups in
        order of first appearance, so within a read batch nothing waits behind later rows."""
        groups: dict[str, list[_Pending]] = {}
        for record in batch:
            seq, shard.rows_read = shard.rows_read, shard.rows_read + 1
            if record.error:
                pending = _Pending(record, seq, None, record.error)
            else:
                try:
                    messages = render_messages(self.plan.prompt, record.fields, record.row_number)
                    pending = _Pending(record, seq, messages, None)
                except TemplateError as exc:
                    pending = _Pending(record, seq, None, str(exc))
            key = prefix_key(pending.messages) if pending.messages else ""
            groups.setdefault(key, []).append(pending)
        return [p for group in groups.values() for p in group]

    def _fail_shard(self, shard: _OpenShard, reason: str, *, transient: bool) -> None:
        for rid in shard.in_flight:
            self._abort(rid)
            self._in_flight.pop(rid, None)
        shard.in_flight.clear()
        shard.buffer.clear()
        shard.rows.clear()
        shard.openai_lines.clear()
        if shard.writer is not None:
            shard.writer.abort()
            shard.writer = None
        shard.failed, shard.transient, shard.exhausted = reason, transient, True
        close = getattr(shard.batches, "close", None)
        if close is not None:
            close()

    # ---- admission ------------------------------------------------------------------------
    def _submit(self, shard: _OpenShard, pending: _Pending) -> None:
        record, seq = pending.record, pending.seq
        if pending.messages is None:
            self._complete(shard, seq, record, self._base_row(record, error=pending.error))
            return
        try:
            subs = self.requests.build(record.fields, record.row_number, pending.messages,
                                       lambda: self._tokenize(record, pending.messages))
        except (TemplateError, RowInputError) as exc:
            self._complete(shard, seq, record, self._base_row(record, error=str(exc)))
            return
        except Exception as exc:
            message = f"row {record.row_number}: cannot apply the chat template: {exc}"
            self._complete(shard, seq, record, self._base_row(record, error=message))
            return
        base = f"{self._nonce}:{shard.ref.index}:{record.row_number}"
        group, now = RowGroup(subs), time.perf_counter()
        for i, sub in enumerate(subs):
            rid = base if len(subs) == 1 else f"{base}#{i}"
            try:
                self.engine.add_request(rid, sub.token_ids, sub.params)
            except Exception as exc:  # RequestError names the problem; anything else is an engine bug
                if not isinstance(exc, RequestError):
                    log.exception("add_request failed for row %d", record.row_number)
                    exc = f"row {record.row_number}: cannot queue the request: {type(exc).__name__}: {exc}"
                message = str(exc).replace(f"request {rid}", f"row {record.row_number}", 1)
                for j in range(i):  # the row's requests already queued
                    queued = base if len(subs) == 1 else f"{base}#{j}"
                    self._abort(queued)
                    self._in_flight.pop(queued, None)
                    shard.in_flight.discard(queued)
                tokens = sum(len(s.token_ids) for s in subs)
                self._complete(shard, seq, record, self._base_row(record, error=message, prompt_tokens=tokens))
                return
            self._in_flight[rid] = _InFlight(shard, record, seq, now, group, i)
            shard.in_flight.add(rid)

    def _encode(self, messages: list[dict[str, str]]) -> list[int]:
        """The chat template's tokens, or for a raw prompt (/v1/completions) the text's own tokens
        (with the tokenizer's special tokens, e.g. BOS, as a completions endpoint adds them)."""
        if self.plan.prompt.raw_prompt and self.engine.tokenizer is not None:
            return list(self.engine.tokenizer.encode(messages[-1]["content"]))
        return self.engine.apply_chat_template(messages)

    def _tokenize(self, record: Record, messages: list[dict[str, str]]) -> list[int]:
        ids = self._encode(messages)
        if not self.plan.truncate_prompt or len(ids) < self._prompt_budget():
            return ids
        return self._truncated(record, messages, ids)

    def _prompt_budget(self) -> int:
        """Longest prompt kept when truncating: room for max_tokens, but at least half the context."""
        ctx = self.engine.max_model_len
        return max(ctx - self.sampling.max_tokens, ctx // 2)

    def _truncated(self, record: Record, messages: list[dict[str, str]], ids: list[int]) -> list[int]:
        """Cut the document (the prompt field, the text field, or the last turn) until the prompt fits."""
        plan, budget = self.plan, self._prompt_budget()
        fields = dict(record.fields)
        name = plan.prompt.prompt_field or plan.text_field
        cut_field = plan.prompt.messages_field is None and isinstance(fields.get(name), str)
        for _ in range(4):
            text = fields[name] if cut_field else messages[-1]["content"]
            doc = self.engine.encode(text)
            keep = len(doc) - (len(ids) - budget) - 8
            if keep <= 0:
                raise TemplateError(
                    f"row {record.row_number}: prompt is {len(ids)} tokens and stays over {budget} "
                    "even with the document cut away"
                )
            text = self.engine.tokenizer.decode(doc[:keep])
            if cut_field:
                fields[name] = text
                messages = render_messages(plan.prompt, fields, record.row_number)
            else:
                messages = messages[:-1] + [{"role": messages[-1]["role"], "content": text}]
            ids = self._encode(messages)
            if len(ids) < budget:
                return ids
        raise TemplateError(f"row {record.row_number}: could not truncate the prompt under {budget} tokens")

    # ---- stepping ---------------------------------------------------------------------------
    def _step(self) -> None:
        if not self.engine.has_unfinished():  # cannot happen unless the engine lost requests
            self._fail_in_flight("the engine dropped the request")
            return
        started = time.perf_counter()
        try:
            outputs = self.engine.step()
        except Exception as exc:
            # Not one request's fault (the engine isolates those): its state is unknown. Every
            # shard with rows in it fails (transient: the fleet retries it), then the engine is
            # rebuilt and the run goes on with the shards that had nothing in it.
            log.exception("engine step failed; failing the shards in it and rebuilding the engine")
            reason = f"engine failed: {type(exc).__name__}: {exc}"
            for shard in {id(i.shard): i.shard for i in self._in_flight.values()}.values():
                self._fail_shard(shard, reason, transient=True)
            self._fail_in_flight(reason)
            self._replace_engine()
            return
        if self.on_step is not None:
            self.on_step(self.engine, time.perf_counter() - started)
        touched: dict[int, _OpenShard] = {}
        for out in outputs:
            inf = self._in_flight.pop(out.request_id, None)
            if inf is None:
                continue
            inf.shard.in_flight.discard(out.request_id)
            inf.group.outputs[inf.index] = out
            if not inf.group.done:
                continue
            try:
                values = self.requests.row_values(inf.group)
            except Exception as exc:  # scoring a finished row must cost the row only
                log.exception("cannot build the result of row %d", inf.record.row_number)
                values = {"error": f"row {inf.record.row_number}: {type(exc).__name__}: {exc}"}
            row = self._base_row(inf.record, **values, latency_s=time.perf_counter() - inf.admitted_at)
            self._complete(inf.shard, inf.seq, inf.record, row, notify=False)
            touched[inf.shard.ref.index] = inf.shard
        for shard in touched.values():
            self._notify(shard.progress)

    def _replace_engine(self) -> None:
        """A fresh engine from ``engine_factory``; without one, this engine emptied of requests."""
        if self.engine_factory is None:
            self._abort_leftovers()
            return
        self.engine = self.engine_factory()
        self.requests = RequestBuilder(self.plan, self.engine)

    def _fail_in_flight(self, message: str) -> None:
        """Every request in the engine becomes an error row; the engine is left empty."""
        failed: set[int] = set()
        for rid, inf in list(self._in_flight.items()):
            self._abort(rid)
            inf.shard.in_flight.discard(rid)
            if id(inf.group) in failed:  # one error row per row, whatever its number of requests
                continue
            failed.add(id(inf.group))
            row = self._base_row(
                inf.record, error=f"row {inf.record.row_number}: {message}",
                latency_s=time.perf_counter() - inf.admitted_at,
            )
            self._complete(inf.shard, inf.seq, inf.record, row)
        self._in_flight.clear()

    # ---- rows -------------------------------------------------------------------------------
    def _base_row(self, record: Record, **values: Any) -> dict[str, Any]:
        row: dict[str, Any] = {"id": record.id}
        for name in self.plan.passthrough_fields:
            row[name] = passthrough_value(record.fields.get(name))
        row.update(empty_result())
        row["finish_reason"] = "error" if values.get("error") else None
        row.update(values)
        if row["error"] and row["finish_reason"] is None:
            row["finish_reason"] = "error"
        for name in self.plan.extra_columns:
            row.setdefault(name, None)
        return row

    def _complete(
        self, shard: _OpenShard, seq: int, record: Record, row: dict[str, Any], notify: bool = True
    ) -> None:
        """Run the row hook, then keep the row for the shard's part."""
        if shard.failed is not None:  # its part is abandoned (e.g. a spool write failed)
            return
        line = None
        if self.hook is not None:
            line = self._apply_hook(row, record)
        if self.plan.openai_output:
            shard.openai_lines[seq] = line or openai_line(
                row, self.plan.job_id, str(self.plan.engine.get("model", "")), completion=self.plan.prompt.raw_prompt)
        shard.rows[seq] = row
        p = shard.progress
        p.rows_done += 1
        p.errors += row["error"] is not None
        p.prompt_tokens += row["prompt_tokens"]
        p.output_tokens += row["output_tokens"]
        shard.cached_prompt_tokens += row["cached_prompt_tokens"]
        p.cached_prompt_tokens = shard.cached_prompt_tokens
        if len(shard.rows) >= SPOOL_ROWS:
            self._spool(shard, at_least=SPOOL_ROWS // 4)
        if notify:
            self._notify(p)

    def _spool(self, shard: _OpenShard, at_least: int = 0) -> None:
        """Append the finished rows that continue the part in input order to its writer, if there
        are ``at_least`` of them: one slow row holds the rest back, and spooling only runs of a
        useful length keeps row groups from shrinking to a few rows."""
        n = 0
        while shard.rows_spooled + n in shard.rows:
            n += 1
        if n < at_least or (n == 0 and shard.writer is not None):
            return
        rows = [shard.rows.pop(shard.rows_spooled + i) for i in range(n)]
        shard.rows_spooled += n
        try:
            if shard.writer is None:
                shard.writer = PartWriter(
                    self.plan.output_url, shard.ref.part_id, self.schema,
                    fingerprint=self.plan.part_fingerprint(shard.ref.fingerprint),
                    storage_options=self.plan.output_options,
                )
            if rows:
                shard.writer.write(rows_to_table(rows, self.schema))
        except Exception as exc:
            log.exception("cannot spool rows of part %s", shard.ref.part_id)
            self._fail_shard(shard, f"cannot write the output part: {type(exc).__name__}: {exc}", transient=False)

    def _apply_hook(self, row: dict[str, Any], record: Record) -> dict[str, Any] | None:
        """Fill extra columns from the hook; a failing hook turns the row into an error row."""
        try:
            extra = self.hook(dict(row), dict(record.fields), dict(self.plan.hook_options)) or {}
            if not isinstance(extra, dict):
                raise TypeError(f"returned {type(extra).__name__}, expected a dict")
            values = {}
            for name, value in extra.items():
                if name in self.extra_types:
                    try:
                        values[name] = coerce_extra(value, self.extra_types[name])
                    except (TypeError, ValueError) as exc:
                        raise TypeError(f"column {name!r}: {exc}") from None
            row.update(values)
            line = extra.get(OPENAI_LINE_KEY)
            return line if isinstance(line, dict) else None
        except Exception as exc:
            if isinstance(exc, RowRejected):  # the kind's own verdict on the output, worded for users
                message = str(exc)
            else:
                message = f"row hook {self.plan.row_hook} failed: {type(exc).__name__}: {exc}"
            row["error"] = f"{row['error']}; {message}" if row["error"] else f"row {record.row_number}: {message}"
            row["finish_reason"] = row["finish_reason"] or "error"
            return None

    # ---- finishing -------------------------------------------------------------------------
    def _finish(self, shard: _OpenShard) -> dict[str, Any]:
        ref = shard.ref
        if shard.failed is not None:
            return self._result(ref, "failed", shard.started, reason=shard.failed, transient=shard.transient)
        p = shard.progress
        counts = dict(
            rows=p.rows_done, errors=p.errors, prompt_tokens=p.prompt_tokens, output_tokens=p.output_tokens,
            cached_prompt_tokens=shard.cached_prompt_tokens,
        )
        try:
            if self.plan.openai_output:
                lines = [shard.openai_lines[n] for n in sorted(shard.openai_lines)]
                write_text(
                    join_url(self.plan.output_url, jsonl_name(ref.part_id)), lines_to_jsonl(lines),
                    self.plan.output_options,
                )
            self._spool(shard)
            if shard.failed is not None:
                return self._result(ref, "failed", shard.started, reason=shard.failed, transient=shard.transient)
            assert shard.writer is not None and not shard.rows, "every read row is spooled by now"
            shard.writer.commit(result_metadata(counts))  # commit closes the writer and its local file
            shard.writer = None
        except Exception as exc:
            if shard.writer is not None:
                shard.writer.abort()
            log.exception("cannot write part %s", ref.part_id)
            return self._result(
                ref, "failed", shard.started, reason=f"cannot write the output part: {type(exc).__name__}: {exc}",
                transient=is_transient(exc),
            )
        return self._result(ref, "done", shard.started, **counts)

    def _cancel_all(self, opened: list[_OpenShard], feed: ShardFeed) -> Iterator[dict[str, Any]]:
        for shard in opened:
            self._fail_shard(shard, "cancelled", transient=False)
            yield self._result(shard.ref, "cancelled", shard.started, reason="job cancelled")
        while (ref := feed.next_shard(wait=False)) is not None:
            yield self._result(ref, "cancelled", time.perf_counter(), reason="job cancelled")

    def _result(self, ref: ShardRef, status: str, started: float, **values: Any) -> dict[str, Any]:
        stats = {}
        try:
            s = self.engine.stats()
            stats = {k: s[k] for k in ("kv_peak_usage", "prefix_cache_hit_tokens", "mean_running_seqs", "preemptions",
                                       "steps")}
        except Exception:  # a broken engine must not hide the shard's result
            pass
        counts = {k: v for k, v in values.items() if k in ("rows", "errors", "prompt_tokens", "output_tokens",
                                                          "cached_prompt_tokens", "reason", "transient")}
        result = ShardResult(
            index=ref.index, url=ref.url, status=status, seconds=round(time.perf_counter() - started, 3),
            worker=self.worker, part=ref.part_id, engine=stats, **counts,
        ).to_dict()
        progress = ShardProgress(
            ref.index, ref.url, status, rows_done=result["rows"], errors=result["errors"],
            prompt_tokens=result["prompt_tokens"], output_tokens=result["output_tokens"], reason=result["reason"],
            transient=result["transient"],
            cached_prompt_tokens=result["cached_prompt_tokens"],
        )
        self._notify(progress)
        return result

    def _notify(self, progress: ShardProgress) -> None:
        if self.on_progress is None:
            return
        try:
            self.on_progress(progress)
        except Exception as exc:  # progress display/reporting must never fail a shard
            log.warning("progress callback failed: %s", exc)
