"""One shard's finished rows on their way into its part, in input order.

Rows finish in any order (short answers overtake long ones); the part holds them in
input order. Finished rows wait here until they continue the part's prefix, and are
appended ("spooled") to the part's local file in runs of a useful length, so a
million-row shard holds a few thousand rows in memory, not a million. ``commit`` hands
connectors the OpenAI lines (if any), the last rows and the shard's counts, and has the
part moved into place; until then no reader sees it. A shard whose part cannot be
written is ``abandoned``: its rows are dropped and nothing is committed.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa

from connectors import PartWriter, ShardRef, is_transient, write_part_lines
from pipeline.output_schema import rows_to_table
from pipeline.plan import JobPlan
from pipeline.shard_outcome import ShardCounts

log = logging.getLogger(__name__)

# Finished rows are appended to the part once this many are waiting.
SPOOL_ROWS = 2048


class PartSink:
    def __init__(self, plan: JobPlan, ref: ShardRef, schema: pa.Schema) -> None:
        self.plan, self.ref, self.schema = plan, ref, schema
        self.rows: dict[int, dict[str, Any]] = {}  # position -> finished row not yet spooled
        self.openai_lines: dict[int, dict[str, Any]] = {}
        self.spooled = 0  # rows at positions [0, spooled) are in the writer
        self.writer: PartWriter | None = None
        self.counts = ShardCounts()
        self.failed: str | None = None  # why the part is abandoned
        self.transient = False

    def add(self, position: int, row: dict[str, Any], openai_line: dict[str, Any] | None) -> None:
        """Keep a finished row (and its OpenAI line); spool when enough are waiting."""
        if self.failed is not None:
            return
        if openai_line is not None:
            self.openai_lines[position] = openai_line
        self.rows[position] = row
        self.counts.add_row(row)
        if len(self.rows) >= SPOOL_ROWS:
            self.spool(at_least=SPOOL_ROWS // 4)

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
            if self.writer is None:
                self.writer = PartWriter(
                    self.plan.output_url, self.ref.part_id, self.schema,
                    fingerprint=self.plan.part_fingerprint(self.ref.fingerprint),
                    storage_options=self.plan.output_options,
                )
            if rows:
                self.writer.write(rows_to_table(rows, self.schema))
        except Exception as exc:
            log.exception("cannot spool rows of part %s", self.ref.part_id)
            self.abandon(f"cannot write the output part: {type(exc).__name__}: {exc}", transient=False)

    def abandon(self, reason: str, *, transient: bool) -> None:
        """Drop everything: the part will not be written (``reason`` says why)."""
        self.rows.clear()
        self.openai_lines.clear()
        self.discard()
        self.failed, self.transient = reason, transient

    def discard(self) -> None:
        """Throw away the part's local file, if one was started."""
        if self.writer is not None:
            self.writer.abort()
            self.writer = None

    def commit(self) -> None:
        """Write the OpenAI lines, the rows not yet spooled and the footer, and publish the part.
        On failure the part is abandoned (``failed`` says why); nothing half-written stays."""
        if self.failed is not None:
            return
        try:
            if self.plan.openai_output:
                lines = [self.openai_lines[n] for n in sorted(self.openai_lines)]
                write_part_lines(self.plan.output_url, self.ref.part_id, lines, self.plan.output_options)
            self.spool()
            if self.failed is not None:
                return
            assert self.writer is not None and not self.rows, "every read row is spooled by now"
            self.writer.commit_with_result(self.counts.to_dict())  # commit closes the writer and its local file
            self.writer = None
        except Exception as exc:
            self.discard()
            log.exception("cannot write part %s", self.ref.part_id)
            self.failed = f"cannot write the output part: {type(exc).__name__}: {exc}"
            self.transient = is_transient(exc)
