"""The tables of a job spec (``[input]``, ``[output]``, ``[prompt]``, ...), one pydantic model each
(``[model]`` and ``[sampling]``, derived from the engine's settings, are in ``jobs.engine_sections``).

Every table forbids unknown keys: a typo (``txt_field``) must fail loudly and name itself
instead of silently falling back to a default. Relative local paths are resolved against
the spec file's folder (passed as validation context ``base_dir``), so a spec means the
same thing whatever directory the command runs from.
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from jobs.secrets import protect
from pipeline.plan import DEFAULT_CHECKPOINT_ROWS, DEFAULT_CHECKPOINT_SECONDS, DEFAULT_MAX_ERROR_FRACTION
from pipeline.prompts import TemplateError, validate_template

_DOTDOT = re.compile(r"(^|[/\\])(\.\.|%2e%2e)([/\\]|$)", re.IGNORECASE)


def is_local(url: str) -> bool:
    """A plain path (no ``scheme://``)."""
    return "://" not in url


def resolve_local(url: str, info: ValidationInfo) -> str:
    """A relative local path made absolute against the spec's folder (or the working directory)."""
    if not is_local(url):
        return url
    path = os.path.expanduser(url)
    if not os.path.isabs(path):
        base = (info.context or {}).get("base_dir") or os.getcwd()
        path = os.path.join(str(base), path)
    trailing = "/" if url.endswith("/") else ""
    return os.path.normpath(path) + trailing


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class InputSection(Section):
    url: str = Field(min_length=1, description="file, directory/prefix or glob; relative paths: from the spec's folder")
    glob: str | None = Field(None, description="appended to url, e.g. '*.jsonl'")
    format: Literal["jsonl", "parquet", "csv", "openai_batch"] | None = None
    id_field: str | None = None
    text_field: str = Field("text", min_length=1)
    passthrough: list[str] = Field(default_factory=list, description="input columns copied to the output")
    split_row_groups: bool = False
    storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description="fsspec options; credentials redacted. '${env:NAME}' is read from the environment of the "
        "process that opens the storage (a worker's own); only such references and profiles go to a fleet",
    )

    @field_validator("url")
    @classmethod
    def _resolve(cls, url: str, info: ValidationInfo) -> str:
        return resolve_local(url, info)

    @field_validator("storage_options")
    @classmethod
    def _protect(cls, options: dict[str, Any]) -> dict[str, Any]:
        return protect(options)

    @property
    def full_url(self) -> str:
        if not self.glob:
            return self.url
        return self.url.rstrip("/") + "/" + self.glob.lstrip("/")


class OutputSection(Section):
    url: str = Field(min_length=1, description="where parts and the manifest go; relative: from the spec's folder")
    openai_format: bool | None = Field(
        None, description="also write OpenAI batch output lines (default: on for kind openai_batch)"
    )
    storage_options: dict[str, Any] | None = Field(
        None, description="fsspec options of the output store (default: the input's); credentials redacted"
    )
    checkpoint_rows: int = Field(
        DEFAULT_CHECKPOINT_ROWS, ge=0,
        description="commit a shard's finished rows every this many rows, so a killed worker loses only "
                    "the rows since (0: not by rows)",
    )
    checkpoint_seconds: float = Field(
        DEFAULT_CHECKPOINT_SECONDS, ge=0,
        description="... and at least every this many seconds (0: not by time; both 0: no checkpoints)",
    )
    max_error_fraction: float | None = Field(
        None, ge=0, le=1,
        description=f"fail the job when more than this fraction of its rows are errors (default "
                    f"{DEFAULT_MAX_ERROR_FRACTION}; 1 for kinds openai_batch and harness_requests, whose callers read "
                    f"each row's error)",
    )
    max_error_rows: int | None = Field(None, ge=0, description="... or more than this many (default: no count limit)")

    @field_validator("storage_options")
    @classmethod
    def _protect(cls, options: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if options is None else protect(options)

    @field_validator("url")
    @classmethod
    def _no_escape(cls, url: str, info: ValidationInfo) -> str:
        if _DOTDOT.search(url):
            raise ValueError(f"{url!r} contains a '..' segment; give the output location without '..'")
        return resolve_local(url, info)


class FewShot(Section):
    """One worked example: becomes a user turn and an assistant turn in the shared prefix."""

    user: str
    assistant: str


class PromptSection(Section):
    system: str | None = Field(None, description="the shared instruction (default: the kind's)")
    template: str | None = Field(None, description="user turn with {field} placeholders (default: '{<text_field>}')")
    prompt_field: str | None = Field(None, description="kind 'generate': the column holding the whole user turn")
    few_shot: list[FewShot] = Field(default_factory=list)

    @field_validator("template")
    @classmethod
    def _plain_placeholders(cls, template: str | None) -> str | None:
        if template is not None:
            try:
                validate_template(template)
            except TemplateError as exc:
                raise ValueError(str(exc).removeprefix("prompt template: ")) from None
        return template


class EvaluateSection(Section):
    reference_field: str = Field("answer", min_length=1, description="input column with the expected answer")
    method: Literal["exact", "choice", "contains", "regex", "loglikelihood"] = "exact"
    pattern: str | None = Field(None, description="method 'regex': extracts the answer (group 1, or the match)")
    choices_field: str = Field("choices", min_length=1, description="method 'loglikelihood': the list of choices")
    chat_template: bool = Field(True, description="method 'loglikelihood': context in the chat template, else text")
    target_delimiter: str | None = Field(
        None, description="method 'loglikelihood': between context and choice (default '' in chat, ' ' in text)"
    )
    bootstrap_iters: int = Field(1000, ge=10, le=100_000, description="resamples for the standard errors")
    pass_k: list[int] = Field(default_factory=list, description="with sampling.n > 1: k values (default [1, n])")

    @field_validator("pass_k")
    @classmethod
    def _positive(cls, ks: list[int]) -> list[int]:
        if any(k < 1 for k in ks):
            raise ValueError("k values must be >= 1")
        return ks

    @field_validator("pattern")
    @classmethod
    def _compiles_pattern(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"not a valid regular expression: {exc}") from None
        return pattern


class ExtractSection(Section):
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
        import json

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
