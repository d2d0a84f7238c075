"""Kind ``extract``: every row's text becomes one JSON object that matches ``[extract] schema``.

Decoding is constrained to the schema, and each top-level property is a typed column of
the output (``jobs.extract``). The default instruction shows the model the schema.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from jobs.extract import extract_row, schema_columns, summarize_extract
from jobs.kinds.base import JobKind, few_shot_turns, reject_prompt_field, user_template
from pipeline.kind_steps import Step
from pipeline.plan import PromptPlan

if TYPE_CHECKING:
    from jobs.spec import JobSpec
    from pipeline.plan import JobPlan

ROW = Step("jobs.extract:extract_row", extract_row)
SUMMARY = Step("jobs.extract:summarize_extract", summarize_extract)
DEFAULT_SYSTEM = "Extract the information from the user's text as a JSON object matching this JSON schema:\n{schema}"


class Extract(JobKind):
    name = "extract"

    def check(self, spec: JobSpec) -> None:
        from jobs.spec import RESERVED_COLUMNS

        reject_prompt_field(spec)
        if spec.extract is None:
            raise ValueError("extract: kind 'extract' needs an [extract] table with the JSON schema")
        schema = spec.extract.load_schema()
        columns = set(schema_columns(schema))
        for taken, what in ((RESERVED_COLUMNS, "output columns"), (set(spec.input.passthrough), "input.passthrough")):
            clash = sorted(columns & set(taken))
            if clash:
                raise ValueError(f"extract.schema: properties {clash} clash with {what}")

    def plan_fields(self, spec: JobSpec, *, read_only: bool = False) -> dict[str, Any]:
        assert spec.extract is not None
        schema = spec.extract.load_schema()
        columns = schema_columns(schema)
        system = spec.prompt.system
        if system is None:
            system = DEFAULT_SYSTEM.format(schema=json.dumps(schema, ensure_ascii=False))
        sampling = spec.sampling.plan_values()
        sampling["structured_output"] = {"json": schema}
        return {
            "prompt": PromptPlan(system=system, user_template=user_template(spec), few_shot=few_shot_turns(spec)),
            "sampling": sampling,
            "hook_options": {"schema": schema, "columns": columns},
            "extra_columns": {name: "string" if kind == "json" else kind for name, kind in columns.items()},
        }

    def row_step(self, plan: JobPlan) -> Step:
        return ROW

    def summary_step(self, plan: JobPlan) -> Step:
        return SUMMARY
