"""A record's output row: the fixed columns, the request's values, then the kind's row step.

Every read row gets exactly one output row (rows in == rows out), whether it produced
text, was refused, or broke its kind's row step; this is where that row takes its final shape, and
where its OpenAI batch line is made when the plan writes them.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from connectors import Record
from pipeline.kind_stages import RowRejected
from pipeline.openai_output import OPENAI_LINE_KEY, openai_line
from pipeline.output_columns import empty_result
from pipeline.output_schema import coerce_extra, passthrough_value
from pipeline.plan import JobPlan


class ResultRows:
    """Per plan: ``build`` a record's row from its values, ``finish`` it (row step, OpenAI line)."""

    def __init__(self, plan: JobPlan, schema: pa.Schema) -> None:
        self.plan = plan
        self.step = plan.kind_stages().row_stage(plan)
        self.extra_types = {f.name: f.type for f in schema if f.name in plan.extra_columns}
        self.model = str(plan.engine_settings.get("model", ""))

    def build(self, record: Record, **values: Any) -> dict[str, Any]:
        """The row of ``record``: id, passthrough fields, then the fixed columns from ``values``
        (an ``error`` makes ``finish_reason`` "error" unless given), extra columns null."""
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

    def finish(self, record: Record, row: dict[str, Any]) -> dict[str, Any] | None:
        """Run the kind's row step on ``row`` (in place); returns the row's OpenAI line, if the plan writes them."""
        line = self._apply_step(row, record) if self.step is not None else None
        if not self.plan.openai_output:
            return None
        return line or openai_line(row, self.plan.job_id, self.model, completion=self.plan.prompt.raw_prompt)

    def _apply_step(self, row: dict[str, Any], record: Record) -> dict[str, Any] | None:
        """Fill extra columns from the row step; a failing step turns the row into an error row."""
        assert self.step is not None
        try:
            extra = self.step.run(dict(row), dict(record.fields), dict(self.plan.stage_options)) or {}
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
                message = f"row hook {self.step.name} failed: {type(exc).__name__}: {exc}"
            row["error"] = f"{row['error']}; {message}" if row["error"] else f"row {record.row_number}: {message}"
            row["finish_reason"] = row["finish_reason"] or "error"
            return None
