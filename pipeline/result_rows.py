"""A record's output row: the fixed columns, the request's values, then the kind's row step.

Every read row gets exactly one output row (rows in == rows out), whether it produced
text, was refused, or broke its kind's row step; this is where that row takes its final shape, and
where its OpenAI batch line is made when the plan writes them.
"""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa

from connectors import Record
from pipeline.kind_stages import RowRejected
from pipeline.openai_output import OPENAI_LINE_KEY, openai_line
from pipeline.output_schema import coerce_extra, passthrough_value
from pipeline.plan import JobPlan
from pipeline.result_row import RequestResult, ResultRow


class ResultRows:
    """Per plan: ``build`` a record's row from its result, ``finish`` it (row step, OpenAI line)."""

    def __init__(self, plan: JobPlan, schema: pa.Schema) -> None:
        self.plan = plan
        self.step = plan.kind_stages().row_stage(plan)
        self.extra_types = {f.name: f.type for f in schema if f.name in plan.extra_columns}
        self.model = str(plan.engine_settings.get("model", ""))

    def build(self, record: Record, result: RequestResult, *, latency_s: float | None = None,
              content_key: str | None = None) -> ResultRow:
        """The row of ``record``: id, passthrough fields, then the fixed columns from ``result``
        (an ``error`` makes ``finish_reason`` "error" unless given), extra columns null."""
        columns = dict(result.columns)
        for name in self.plan.extra_columns:
            columns.setdefault(name, None)
        finish_reason = result.finish_reason
        if result.error and finish_reason is None:
            finish_reason = "error"
        return ResultRow(
            id=record.id,
            passthrough={name: passthrough_value(record.fields.get(name)) for name in self.plan.passthrough_fields},
            output=result.output, finish_reason=finish_reason, prompt_tokens=result.prompt_tokens,
            output_tokens=result.output_tokens, cached_prompt_tokens=result.cached_prompt_tokens,
            error=result.error, latency_s=result.latency_s if latency_s is None else latency_s,
            content_key=content_key, columns=columns, choices=result.choices,
        )

    def finish(self, record: Record, row: ResultRow) -> ResultRow:
        """The row after the kind's row step, with its OpenAI line if the plan writes them (the
        step's own line, else the pipeline's)."""
        if self.step is not None:
            row = self._apply_step(row, record)
        if not self.plan.openai_output:
            return row if row.openai_line is None else replace(row, openai_line=None)
        if row.openai_line is not None:
            return row
        return replace(row, openai_line=openai_line(row, self.plan.job_id, self.model,
                                                    completion=self.plan.prompt.raw_prompt))

    def _apply_step(self, row: ResultRow, record: Record) -> ResultRow:
        """Fill extra columns (and the step's own OpenAI line, if it makes one) from the row step;
        a failing step turns the row into an error row."""
        assert self.step is not None
        try:
            extra = self.step.run(row.values(), dict(record.fields), dict(self.plan.stage_options)) or {}
            if not isinstance(extra, dict):
                raise TypeError(f"returned {type(extra).__name__}, expected a dict")
            values = {}
            for name, value in extra.items():
                if name in self.extra_types:
                    try:
                        values[name] = coerce_extra(value, self.extra_types[name])
                    except (TypeError, ValueError) as exc:
                        raise TypeError(f"column {name!r}: {exc}") from None
            line = extra.get(OPENAI_LINE_KEY)
            line = line if isinstance(line, dict) and line else None  # an empty one: the pipeline's
            return replace(row, columns={**row.columns, **values}, openai_line=line)
        except Exception as exc:
            if isinstance(exc, RowRejected):  # the kind's own verdict on the output, worded for users
                message = str(exc)
            else:
                message = f"row hook {self.step.name} failed: {type(exc).__name__}: {exc}"
            error = f"{row.error}; {message}" if row.error else f"row {record.row_number}: {message}"
            return replace(row, error=error, finish_reason=row.finish_reason or "error")
