"""Kind ``extract``: every row's text becomes one JSON object that matches ``[extract] schema``.

Decoding is constrained to the schema, and each top-level property is a typed column of
the output (``jobs.extract``). The default instruction shows the model the schema.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from jobs.extract import extract_row, schema_columns, summarize_extract
from jobs.kinds.base import JobKind, few_shot_turns, reject_prompt_field, user_template
from jobs.sections import Section, resolve_local
from pipeline.kind_stages import Stage
from pipeline.plan import PromptPlan

if TYPE_CHECKING:
    from jobs.spec import JobSpec
    from pipeline.plan import JobPlan

ROW = Stage("jobs.extract:extract_row", extract_row)
SUMMARY = Stage("jobs.extract:summarize_extract", summarize_extract)
DEFAULT_SYSTEM = "Extract the information from the user's text as a JSON object matching this JSON schema:\n{schema}"


class ExtractOptions(Section):
    """Kind ``extract``: a JSON schema (inline, or a file) whose top-level properties become columns."""

    model_config = ConfigDict(extra="forbid", validate_default=True, populate_by_name=True)

    json_schema: dict[str, Any] | None = Field(None, alias="schema", description="the JSON schema, inline")
    schema_file: str | None = Field(None, description="a .json file holding the schema; relative: from the spec")

    @field_validator("schema_file")
    @classmethod
    def _resolve(cls, path: str | None, info: ValidationInfo) -> str | None:
        return resolve_local(path, info) if path else path

    def load_schema(self) -> dict[str, Any]:
        """The schema, checked: a valid JSON schema of an object with properties."""

        import jsonschema

        if (self.json_schema is None) == (self.schema_file is None):
            raise ValueError("extract: give exactly one of extract.schema and extract.schema_file")
        schema, where = self.json_schema, "extract.schema"
        if schema is None:
            where = "extract.schema_file"
            try:
                with open(str(self.schema_file), encoding="utf-8") as f:
                    schema = json.load(f)
            except OSError as exc:
                raise ValueError(f"{where}: cannot read {self.schema_file}: {exc.strerror or exc}") from None
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not JSON: {exc}") from None
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"{where}: not a valid JSON schema: {exc.message}") from None
        if schema.get("type") != "object" or not isinstance(schema.get("properties"), dict) or not schema["properties"]:
            raise ValueError(f"{where}: must describe an object (type 'object') with properties")
        return schema


class Extract(JobKind):
    name = "extract"
    Options = ExtractOptions

    def check(self, spec: JobSpec) -> None:
        from pipeline.output_columns import RESERVED_COLUMNS

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
            "stage_options": {"schema": schema, "columns": columns},
            "extra_columns": {name: "string" if kind == "json" else kind for name, kind in columns.items()},
        }

    def row_stage(self, plan: JobPlan) -> Stage:
        return ROW

    def summary_stage(self, plan: JobPlan) -> Stage:
        return SUMMARY

    def console_lines(self, summary: dict[str, Any]) -> list[tuple[str, str]]:
        return [("valid outputs", f"{summary['valid']}/{summary['rows']}")] if summary.get("valid") is not None else []
