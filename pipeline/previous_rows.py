"""The results of a shard's previous part, by content key: what a re-run of a changed shard
takes instead of computing (issue 28). A nightly job over a file that gained 1% new rows
computes those rows, not the file.

A row not in its own shard's previous part is looked up in every part of the output
(``load_output_rows``): a row moved to another file is taken from wherever it sat, as long as
the output's parts weigh at most ``OUTPUT_ROWS_BYTES`` (their computed columns are held in
memory for the run; a larger output looks in the shard's own part only).

Only whole results are taken: every request shape's (a generation, or a kind's
shape: its columns are in the part), with an OpenAI line's choices read back from
the part's ``.jsonl`` lines when the plan writes them (only lines whose SHA-256 the part's
footer names, one a row), and rows without an error (an error may be transient, and a row
step's error is the step's to make again).
"""

from __future__ import annotations

import json
import logging

import pyarrow as pa

from connectors import ShardRef, list_part_sizes, read_part_if_any, read_part_lines
from pipeline.openai_output import choices_of_line
from pipeline.output_columns import COMPUTED_COLUMNS
from pipeline.plan import JobPlan
from pipeline.result_row import OpenAIChoice, RequestResult

log = logging.getLogger(__name__)

# A generation's own columns, with n samples (``pipeline.row_requests``); a kind's request shape
# names its own. With the computed columns, all a finished row's values; the kind's row stage
# derives the rest (a score) from them again.
_GENERATED_COLUMNS = ("samples", "sample_finish_reasons")
# A column of the lookup's table only (never of a part): a taken row's OpenAI choices as JSON
# text, read from the part's lines.
CHOICES_JSON = "openai_choices_json"
# The output-wide lookup reads every part's computed columns once a run: a bound on its memory.
OUTPUT_ROWS_BYTES = 256 * 2**20


class PreviousRows:
    """``result(key)``: the computed columns of the previous part's row with that key, or None."""

    def __init__(self, table: pa.Table, columns: list[str]) -> None:
        self.table = table.select(columns)
        keys = table.column("content_key").to_pylist()
        errors = table.column("error").is_null().to_pylist()
        self.index = {k: i for i, (k, ok) in enumerate(zip(keys, errors, strict=True)) if k and ok}

    def __len__(self) -> int:
        return len(self.index)

    def result(self, key: str | None) -> RequestResult | None:
        i = self.index.get(key) if key else None
        if i is None:
            return None
        (row,) = self.table.slice(i, 1).to_pylist()
        choices = None
        if CHOICES_JSON in row:  # the OpenAI line's choices, kept as JSON text
            text = row.pop(CHOICES_JSON)
            choices = tuple(OpenAIChoice.from_dict(c) for c in json.loads(text)) if text else None
        return RequestResult.from_values({**row, "error": None}, choices or None)


def _columns(plan: JobPlan) -> list[str]:
    """The columns a taken row needs (with the OpenAI lines' choices when the plan writes them)."""
    shape = plan.kind_stages().request_shape(plan)
    own = _GENERATED_COLUMNS if shape is None else shape.columns
    columns = [*COMPUTED_COLUMNS, *(c for c in own if c in plan.extra_columns)]
    return [*columns, CHOICES_JSON] if plan.openai_output else columns


def _read(plan: JobPlan, part: str, columns: list[str]) -> pa.Table | None:
    stored = [c for c in columns if c != CHOICES_JSON]
    table = read_part_if_any(plan.output_url, part, ["content_key", "error", *stored], plan.output_options)
    if table is None or not {"content_key", "error", *stored} <= set(table.column_names):
        return None
    table = table.select(["content_key", "error", *stored])
    if not plan.openai_output:
        return table
    lines = read_part_lines(plan.output_url, part, plan.output_options)  # one a row, in order
    if lines is None or len(lines) != table.num_rows:
        return None  # lines that did not follow their part: nothing taken
    choices = [choices_of_line(line) for line in lines]
    texts = [json.dumps([x.to_dict() for x in c]) if c else None for c in choices]
    return table.append_column(CHOICES_JSON, pa.array(texts, pa.string()))


def load_output_rows(plan: JobPlan) -> PreviousRows | None:
    """Every committed row of every part of the output, by content key (see the docstring);
    None if there is none, nothing can be taken or the parts weigh over ``OUTPUT_ROWS_BYTES``."""
    columns = _columns(plan)
    sizes = list_part_sizes(plan.output_url, plan.output_options, with_lines=plan.openai_output)
    if sum(sizes.values()) > OUTPUT_ROWS_BYTES:
        log.info("the parts of %s weigh over %d MiB: rows are taken from their own shard's part only",
                 plan.output_url, OUTPUT_ROWS_BYTES >> 20)
        return None
    tables = [t for t in (_read(plan, part, columns) for part in sorted(sizes)) if t is not None]
    if not tables:
        return None
    try:
        rows = PreviousRows(pa.concat_tables(tables, promote_options="permissive"), columns)
    except Exception as exc:  # parts this code did not write: compute, as without them
        log.warning("cannot index the parts of %s: %s: %s", plan.output_url, type(exc).__name__, exc)
        return None
    return rows or None


def load_previous_rows(plan: JobPlan, ref: ShardRef) -> PreviousRows | None:
    """The previous part of ``ref``'s shard, whatever input version or plan wrote it (the keys
    say which rows still hold); None if there is none or nothing in it can be taken."""
    columns = _columns(plan)
    table = _read(plan, ref.part_id, columns)
    if table is None:
        return None
    try:
        rows = PreviousRows(table, columns)
    except Exception as exc:  # a part this code did not write: compute every row, as without one
        log.warning("cannot index the previous part %s: %s: %s", ref.part_id, type(exc).__name__, exc)
        return None
    if rows:
        log.info("part %s: %d rows of the previous part may be taken", ref.part_id, len(rows))
    return rows or None
