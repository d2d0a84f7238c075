"""One shard's finished rows on their way into its part, in input order.

Rows finish in any order (short answers overtake long ones); the part holds them in
input order. Finished rows wait here until they continue the part's prefix, and are
appended ("spooled") to the part's local file in runs of a useful length, so a
million-row shard holds a few thousand rows in memory, not a million. ``commit`` hands
connectors the last rows and the shard's counts, and has the part moved into place; until
then no reader sees it. The OpenAI lines (if any) follow only once the part is committed,
never ahead of a part that may still fail (the part's footer holds their digest). A shard whose part cannot be
written is ``abandoned``: its rows are dropped and nothing is committed.

Checkpoints (``plan.checkpoint_rows`` / ``checkpoint_seconds``): every so often the rows
that continue the part in input order are also committed as an immutable chunk of the
shard's checkpoint (``connectors.ShardCheckpoint``), so a worker killed or drained mid-shard
loses only the rows since then. ``resume`` starts a shard where an earlier attempt's
checkpoint ends: its chunks go into the part's file first, and reading skips their rows.
The part is still one file, committed as before; the checkpoint is removed after it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from connectors import (
    PartWriter,
    ShardCheckpoint,
    ShardRef,
    encode_part_lines,
    is_transient,
    lines_sha256,
    write_part_lines,
)
from pipeline.output_schema import rows_to_table
from pipeline.plan import JobPlan
from pipeline.result_row import ResultRow
from pipeline.shard_outcome import ShardCounts

log = logging.getLogger(__name__)

# Finished rows are appended to the part once this many are waiting.
SPOOL_ROWS = 2048


class PartSink:
    def __init__(self, plan: JobPlan, ref: ShardRef, schema: pa.Schema) -> None:
        self.plan, self.ref, self.schema = plan, ref, schema
        self.rows: dict[int, ResultRow] = {}  # position -> finished row not yet spooled
        self.openai_lines: dict[int, dict[str, Any]] = {}
        self.spooled = 0  # rows at positions [0, spooled) are in the writer
        self.writer: PartWriter | None = None
        self.counts = ShardCounts()
        self.failed: str | None = None  # why the part is abandoned
        self.commit_id: str | None = None  # the committed part's identity (its footer's commit id)
        self.transient = False
        self.checkpoint: ShardCheckpoint | None = None
        if plan.checkpoints:
            self.checkpoint = ShardCheckpoint(plan.output_url, ref.part_id, plan.part_fingerprint(ref.fingerprint),
                                              plan.output_options)
        self.checkpointed = 0  # rows [0, checkpointed) are in the checkpoint's chunks
        self.resumed = 0  # of those, rows an earlier attempt computed
        self.pending: list[pa.Table] = []  # spooled since the last checkpoint: rows [checkpointed, spooled)
        self._last_checkpoint = time.monotonic()  # the last attempt, and the row count the next is due at:
        self._rows_due = plan.checkpoint_rows  # a failed attempt waits a whole interval too

    def resume(self) -> int:
        """Take the rows of the checkpoint an earlier attempt left (only chunks that pass every
        check) into the part's file and counts; returns the input position to go on from."""
        if self.checkpoint is None:
            return 0
        for chunk in self.checkpoint.load(self.schema, self.plan.openai_output):
            self._writer().write(chunk.table)
            self._count(chunk.table)
            for i, line in enumerate(chunk.lines or ()):
                self.openai_lines[chunk.entry.start + i] = line
            self.spooled = self.checkpointed = self.resumed = chunk.entry.end
            self._rows_due = self.resumed + self.plan.checkpoint_rows
        if self.resumed:
            log.info("part %s resumes from its checkpoint at row %d", self.ref.part_id, self.resumed)
        return self.resumed

    def _count(self, table: pa.Table) -> None:
        c = self.counts
        c.rows += table.num_rows
        c.errors += table.num_rows - table.column("error").null_count
        for name in ("prompt_tokens", "output_tokens", "cached_prompt_tokens"):
            setattr(c, name, getattr(c, name) + (pc.sum(table.column(name)).as_py() or 0))

    def _writer(self) -> PartWriter:
        if self.writer is None:
            self.writer = PartWriter(
                self.plan.output_url, self.ref.part_id, self.schema,
                fingerprint=self.plan.part_fingerprint(self.ref.fingerprint),
                storage_options=self.plan.output_options,
            )
        return self.writer

    def add(self, position: int, row: ResultRow) -> None:
        """Keep a finished row (and its OpenAI line); spool when enough are waiting."""
        if self.failed is not None:
            return
        if row.openai_line is not None:
            self.openai_lines[position] = row.openai_line
        self.rows[position] = row
        self.counts.add_row(row)
        if len(self.rows) >= SPOOL_ROWS:
            self.spool(at_least=SPOOL_ROWS // 4)
        if self.checkpoint is not None and self._checkpoint_due():
            self.save_checkpoint()

    def _checkpoint_due(self) -> bool:
        """Whether ``checkpoint_rows`` rows continue the part past the last attempt, or
        ``checkpoint_seconds`` have passed since it and at least one row is new."""
        plan = self.plan
        ready = self.spooled + len(self.rows)  # the part's prefix ends at most here
        if ready <= self.checkpointed:
            return False
        timely = plan.checkpoint_seconds > 0 and time.monotonic() - self._last_checkpoint >= plan.checkpoint_seconds
        if not timely and (plan.checkpoint_rows <= 0 or ready < self._rows_due):
            return False
        run = 0
        while self.spooled + run in self.rows:
            run += 1
        end = self.spooled + run
        return end > self.checkpointed and (timely or end >= self._rows_due)

    def save_checkpoint(self) -> int:
        """Commit the finished rows that continue the part as the checkpoint's next chunk; returns
        the rows committed in chunks. A chunk that cannot be written costs nothing but the
        checkpoint: the shard goes on and the next checkpoint takes its rows too."""
        if self.checkpoint is None or self.failed is not None:
            return self.checkpointed
        self.spool()
        self._last_checkpoint = time.monotonic()
        self._rows_due = self.spooled + self.plan.checkpoint_rows
        if self.failed is not None or self.spooled == self.checkpointed:
            return self.checkpointed
        table = pa.concat_tables(self.pending)
        lines = None
        if self.plan.openai_output:
            lines = [self.openai_lines[p] for p in range(self.checkpointed, self.spooled)]
        try:
            self.checkpoint.save(table, self.checkpointed, lines)
        except Exception as exc:
            log.warning("cannot write a checkpoint of part %s (the shard goes on): %s: %s", self.ref.part_id,
                        type(exc).__name__, exc)
            return self.checkpointed
        self.pending, self.checkpointed = [], self.spooled
        return self.checkpointed

    def spool(self, at_least: int = 0) -> None:
        """Append the finished rows that continue the part in input order to its writer, if there
        are ``at_least`` of them: one slow row holds the rest back, and spooling only runs of a
        useful length keeps row groups from shrinking to a few rows. A failed write abandons the part."""
        n = 0
        while self.spooled + n in self.rows:
            n += 1
        if n < at_least or (n == 0 and self.writer is not None):
            return
        rows = [self.rows.pop(self.spooled + i) for i in range(n)]
        self.spooled += n
        try:
            writer = self._writer()
            if rows:
                table = rows_to_table(rows, self.schema)
                writer.write(table)
                if self.checkpoint is not None:
                    self.pending.append(table)
        except Exception as exc:
            log.exception("cannot spool rows of part %s", self.ref.part_id)
            self.abandon(f"cannot write the output part: {type(exc).__name__}: {exc}", transient=False)

    def abandon(self, reason: str, *, transient: bool) -> None:
        """Drop everything: the part will not be written (``reason`` says why)."""
        self.rows.clear()
        self.openai_lines.clear()
        self.pending = []
        self.discard()
        self.failed, self.transient = reason, transient

    def discard(self) -> None:
        """Throw away the part's local file, if one was started."""
        if self.writer is not None:
            self.writer.abort()
            self.writer = None

    def commit(self) -> None:
        """Write the rows not yet spooled and the footer, publish the part, then its OpenAI lines.
        On failure the part is abandoned (``failed`` says why); nothing half-written stays."""
        if self.failed is not None:
            return
        lines, digest = None, None
        if self.plan.openai_output:
            lines = encode_part_lines([self.openai_lines[n] for n in sorted(self.openai_lines)])
            digest = lines_sha256(lines)
        try:
            self.spool()
            if self.failed is not None:
                return
            assert self.writer is not None and not self.rows, "every read row is spooled by now"
            commit_id = self.writer.commit_id
            self.writer.commit_with_result(self.counts.to_dict(), digest)  # closes the writer and its local file
            self.writer = None
            self.commit_id = commit_id
            what = "the output part's JSON lines"
            if lines is not None:  # after the part: a failed part leaves no new lines
                write_part_lines(self.plan.output_url, self.ref.part_id, lines, self.plan.output_options)
        except Exception as exc:
            self.discard()
            what = "the output part" if self.commit_id is None else what
            log.exception("cannot write %s %s", what, self.ref.part_id)
            self.failed = f"cannot write {what}: {type(exc).__name__}: {exc}"
            self.transient = is_transient(exc)
            return
        if self.checkpoint is not None:
            self.checkpoint.clear()  # the part holds every row now (chunks a dead attempt left too)
