"""The results of a shard's previous part, by content key: what a re-run of a changed shard
takes instead of computing (issue 28). A nightly job over a file that gained 1% new rows
computes those rows, not the file.

Only results that are whole in a part are taken: generate mode (a scoring mode's values and
an OpenAI batch line's choices are not all kept in the part) and rows without an error (an
error may be transient, and a row step's error is the step's to make again).
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa

from connectors import ShardRef, read_part_if_any
from pipeline.output_columns import COMPUTED_COLUMNS
from pipeline.plan import JobPlan, RequestMode

log = logging.getLogger(__name__)

_SAMPLE_COLUMNS = ("samples", "sample_finish_reasons")  # generate mode's own, with n samples


class PreviousRows:
    """``values(key)``: the computed columns of the previous part's row with that key, or None."""

    def __init__(self, table: pa.Table, columns: list[str]) -> None:
        self.table = table.select(columns)
        keys = table.column("content_key").to_pylist()
        errors = table.column("error").is_null().to_pylist()
        self.index = {k: i for i, (k, ok) in enumerate(zip(keys, errors, strict=True)) if k and ok}

    def __len__(self) -> int:
        return len(self.index)

    def values(self, key: str | None) -> dict[str, Any] | None:
        i = self.index.get(key) if key else None
        if i is None:
            return None
        (row,) = self.table.slice(i, 1).to_pylist()
        return {**row, "error": None}


def load_previous_rows(plan: JobPlan, ref: ShardRef) -> PreviousRows | None:
    """The previous part of ``ref``'s shard, whatever input version or plan wrote it (the keys
    say which rows still hold); None if there is none or nothing in it can be taken."""
    if plan.request_mode != RequestMode.GENERATE or plan.openai_output:
        return None
    columns = [*COMPUTED_COLUMNS, *(c for c in _SAMPLE_COLUMNS if c in plan.extra_columns)]
    table = read_part_if_any(plan.output_url, ref.part_id, ["content_key", "error", *columns], plan.output_options)
    if table is None or not {"content_key", "error", *columns} <= set(table.column_names):
        return None
    try:
        rows = PreviousRows(table, columns)
    except Exception as exc:  # a part this code did not write: compute every row, as without one
        log.warning("cannot index the previous part %s: %s: %s", ref.part_id, type(exc).__name__, exc)
        return None
    if rows:
        log.info("part %s: %d rows of the previous part may be taken", ref.part_id, len(rows))
    return rows or None
