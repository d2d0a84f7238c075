"""The tables of a job spec (``[input]``, ``[output]``, ``[prompt]``, ...), one pydantic model each
(``[model]`` and ``[sampling]``, derived from the engine's settings, are in ``jobs.engine_sections``;
a kind's own table is its ``Options`` model, in its module under ``jobs/kinds/``).

Every table forbids unknown keys: a typo (``txt_field``) must fail loudly and name itself
instead of silently falling back to a default. Relative local paths are resolved against
the spec file's folder (passed as validation context ``base_dir``), so a spec means the
same thing whatever directory the command runs from.
"""

from __future__ import annotations

import os
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from jobs.secrets import protect
from pipeline.plan import DEFAULT_CHECKPOINT_ROWS, DEFAULT_CHECKPOINT_SECONDS, DEFAULT_MAX_ERROR_FRACTION
from pipeline.prompts import TemplateError, validate_template

# The formats every kind reads (``connectors.shard_rows``); a kind may add one only it reads.
READ_FORMATS = ("jsonl", "parquet", "csv")
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
    format: str | None = Field(None, description="jsonl, parquet, csv, or a kind's own (default: from the file names)")
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

    @field_validator("format")
    @classmethod
    def _known_format(cls, name: str | None) -> str | None:
        """The read formats, and those a kind reads itself (worded as a Literal's error, as before)."""
        from jobs.kinds import all_kinds

        known = [*READ_FORMATS, *(k.input_format for k in all_kinds() if k.input_format)]
        if name is not None and name not in known:
            expected = ", ".join(repr(k) for k in known[:-1]) + f" or {known[-1]!r}"
            raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
        return name

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
        None, description="also write OpenAI batch output lines (default: the kind's)"
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
                    f"{DEFAULT_MAX_ERROR_FRACTION}; 1 for the kinds whose callers read each row's error)",
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
    prompt_field: str | None = Field(None, description="the column holding the whole user turn, sent as written")
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
