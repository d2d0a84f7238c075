"""A job spec: what a data team writes (TOML, or YAML) to describe one batch job.

The spec is validated completely when it is loaded, before anything runs: unknown keys,
bad values, unsafe templates, bad schedules and cross-field mistakes all fail with the
offending field's path, so a typo costs seconds instead of a half-processed bucket.
``to_plan`` turns it into the JSON-safe ``pipeline.plan.JobPlan`` that workers execute.

Example (see ``examples/`` for one per kind)::

    name = "news-summaries"
    kind = "summarize"
    [input]
    url = "s3://bucket/news/"
    text_field = "body"
    [output]
    url = "s3://bucket/news-summaries/"
    [sampling]
    max_tokens = 96
"""

from __future__ import annotations

import tomllib
import uuid
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from jobs.engine_sections import ModelSection, SamplingSection
from jobs.kinds import KindName, job_kind
from jobs.kinds.embed import EmbedSection
from jobs.schedule import Schedule, parse_schedule
from jobs.secrets import reveal
from jobs.sections import EvaluateSection, ExtractSection, InputSection, OutputSection, PromptSection, Section
from pipeline.output_columns import RESERVED_COLUMNS  # passthrough fields must not reuse these
from pipeline.plan import DEFAULT_MAX_ERROR_FRACTION, JobPlan

# Kinds whose callers read each row's error themselves (an OpenAI batch's error file, lm-eval's
# requests): no error budget unless the spec sets one.
ERRORS_ARE_RESULTS = ("openai_batch", "harness_requests")


class SpecFileError(ValueError):
    """The spec file cannot be read or parsed (before any field is validated)."""


class JobSpec(Section):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="letters, digits, '.', '_', '-'")
    kind: KindName = "summarize"
    input: InputSection
    output: OutputSection
    model: ModelSection = Field(default_factory=ModelSection)
    prompt: PromptSection = Field(default_factory=PromptSection)
    sampling: SamplingSection = Field(default_factory=SamplingSection)
    evaluate: EvaluateSection | None = None
    extract: ExtractSection | None = None
    embed: EmbedSection | None = None
    schedule: str | None = Field(None, description="cron (UTC) like '0 2 * * *', or 'every 30s'")
    truncate_prompt: bool = Field(False, description="cut over-long documents instead of failing the row")

    @field_validator("schedule")
    @classmethod
    def _valid_schedule(cls, value: str | None) -> str | None:
        if value is not None:
            parse_schedule(value)
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> JobSpec:
        if self.evaluate is not None and self.kind != "evaluate":
            raise ValueError(f"evaluate: the [evaluate] table is only for kind 'evaluate' (kind is {self.kind!r})")
        if self.extract is not None and self.kind != "extract":
            raise ValueError(f"extract: the [extract] table is only for kind 'extract' (kind is {self.kind!r})")
        if self.embed is not None and self.kind != "embed":
            raise ValueError(f"embed: the [embed] table is only for kind 'embed' (kind is {self.kind!r})")
        if self.sampling.n > 1 and self.kind not in ("generate", "evaluate"):
            raise ValueError(f"sampling.n: only kinds 'generate' and 'evaluate' take n samples (kind is {self.kind!r})")
        if self.input.format == "openai_batch" and self.kind != "openai_batch":
            raise ValueError("input.format: 'openai_batch' input needs kind = 'openai_batch'")
        if self.model.name is not None and self.model.path is not None:
            raise ValueError("model.path: give model.name or model.path, not both")
        clash = sorted(RESERVED_COLUMNS & set(self.input.passthrough))
        if clash:
            raise ValueError(f"input.passthrough: {clash} clash with output columns")
        job_kind(self.kind).check(self)
        return self

    # ---- loading ------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any], base_dir: str | Path | None = None) -> JobSpec:
        """Validate a parsed spec; relative local paths resolve against ``base_dir`` (default: cwd)."""
        return cls.model_validate(data, context={"base_dir": str(base_dir) if base_dir else None})

    @classmethod
    def from_toml(cls, path: str | Path) -> JobSpec:
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise SpecFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise SpecFileError(f"{path}: invalid TOML: {exc}") from None
        return cls.from_dict(data, path.resolve().parent)

    @classmethod
    def from_yaml(cls, path: str | Path) -> JobSpec:
        import yaml

        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise SpecFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise SpecFileError(f"{path}: invalid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise SpecFileError(f"{path}: expected a mapping at the top level")
        return cls.from_dict(data, path.resolve().parent)

    @classmethod
    def from_file(cls, path: str | Path) -> JobSpec:
        """TOML, or YAML for ``.yaml``/``.yml`` files."""
        if Path(path).suffix.lower() in (".yaml", ".yml"):
            return cls.from_yaml(path)
        return cls.from_toml(path)

    # ---- using ----------------------------------------------------------------------------
    @property
    def parsed_schedule(self) -> Schedule | None:
        return parse_schedule(self.schedule) if self.schedule else None

    def to_data(self) -> dict[str, Any]:
        """A plain dict that ``from_dict`` turns back into this spec (paths already absolute).
        Credentials are in clear: only for handing the spec to a worker."""
        return reveal(self.model_dump(exclude_unset=True))

    def output_storage_options(self) -> dict[str, Any] | None:
        """The output's own storage options in clear (None: the output uses the input's)."""
        return None if self.output.storage_options is None else reveal(self.output.storage_options)

    def new_job_id(self) -> str:
        return f"{self.name}-{uuid.uuid4().hex[:8]}"

    def to_plan(self, job_id: str | None = None, *, read_only: bool = False) -> JobPlan:
        """The JobPlan workers execute. For kind ``openai_batch`` this validates and converts the
        request file (reads the input, writes ``_requests/`` under the output); ``read_only``
        (for status) writes nothing."""
        kind = job_kind(self.kind)
        openai_output = self.output.openai_format
        if openai_output is None:
            openai_output = self.kind == "openai_batch"
        storage_options = reveal(self.input.storage_options)
        values: dict[str, Any] = dict(
            job_id=job_id or self.new_job_id(),
            name=self.name,
            kind=self.kind,
            input_url=self.input.full_url,
            output_url=self.output.url,
            input_format=self.input.format,
            id_field=self.input.id_field,
            text_field=self.input.text_field,
            passthrough_fields=list(self.input.passthrough),
            storage_options=storage_options,
            output_storage_options=self.output_storage_options(),
            split_row_groups=self.input.split_row_groups,
            sampling=self.sampling.plan_values(),
            engine_settings=self.model.engine_settings(),
            truncate_prompt=self.truncate_prompt,
            openai_output=openai_output,
            checkpoint_rows=self.output.checkpoint_rows,
            checkpoint_seconds=self.output.checkpoint_seconds,
            max_error_fraction=self.output.max_error_fraction if self.output.max_error_fraction is not None
            else 1.0 if self.kind in ERRORS_ARE_RESULTS else DEFAULT_MAX_ERROR_FRACTION,
            max_error_rows=self.output.max_error_rows,
        )
        values.update(kind.plan_fields(self, read_only=read_only))
        if openai_output:
            from jobs.openai_merge import merge_options

            values["hook_options"] = {**values.get("hook_options", {}), **merge_options()}
        return JobPlan(**values)
