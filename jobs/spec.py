"""A job spec: what a data team writes (TOML, or YAML) to describe one batch job.

The spec is validated completely when it is loaded, before anything runs: unknown keys,
bad values, unsafe templates, bad schedules and cross-field mistakes all fail with the
offending field's path, so a typo costs seconds instead of a half-processed bucket.
``to_plan`` turns it into the JSON-safe ``pipeline.plan.JobPlan`` that workers execute.
The spec names no kind: ``kind`` is one of ``jobs.kinds.KIND_NAMES``, and each kind with
options adds its table (``[<kind>]``, typed by the kind's ``Options``) from the registry.

Example (the default kind; see ``examples/`` for one per kind)::

    name = "news-summaries"
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

from pydantic import BaseModel, Field, create_model, field_validator, model_validator

from jobs.engine_sections import ModelSection, SamplingSection
from jobs.kinds import DEFAULT_KIND, KindName, all_kinds, job_kind
from jobs.schedule import Schedule, parse_schedule
from jobs.secrets import reveal
from jobs.sections import InputSection, OutputSection, PromptSection, Section
from pipeline.output_columns import RESERVED_COLUMNS  # passthrough fields must not reuse these
from pipeline.plan import DEFAULT_MAX_ERROR_FRACTION, JobPlan


class SpecFileError(ValueError):
    """The spec file cannot be read or parsed (before any field is validated)."""


class _SpecHead(Section):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="letters, digits, '.', '_', '-'")
    kind: KindName = DEFAULT_KIND
    input: InputSection
    output: OutputSection
    model: ModelSection = Field(default_factory=ModelSection)
    prompt: PromptSection = Field(default_factory=PromptSection)
    sampling: SamplingSection = Field(default_factory=SamplingSection)


def _kind_tables() -> dict[str, type[BaseModel]]:
    """Each kind's options table: named after the kind, typed by its ``Options``."""
    tables = {kind.name: kind.Options for kind in all_kinds() if kind.Options is not None}
    taken = set(tables) & set(_SpecHead.model_fields)
    if taken:
        raise RuntimeError(f"kinds {sorted(taken)} would shadow spec tables of the same name")
    return tables


KIND_TABLES = _kind_tables()
_SpecTables = create_model(  # type: ignore[call-overload]
    "_SpecTables", __base__=_SpecHead, **{name: (options | None, None) for name, options in KIND_TABLES.items()})


class JobSpec(_SpecTables):  # type: ignore[valid-type, misc]
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
        for table in KIND_TABLES:
            if getattr(self, table) is not None and self.kind != table:
                raise ValueError(f"{table}: the [{table}] table is only for kind '{table}' (kind is {self.kind!r})")
        kind = job_kind(self.kind)
        if self.sampling.n > 1 and not kind.takes_samples:
            # listed by name, last first: the wording this message has always had
            takers = " and ".join(repr(k.name) for k in sorted(all_kinds(), key=lambda k: k.name, reverse=True)
                                  if k.takes_samples)
            raise ValueError(f"sampling.n: only kinds {takers} take n samples (kind is {self.kind!r})")
        for other in all_kinds():
            if other.input_format is not None and self.input.format == other.input_format and self.kind != other.name:
                raise ValueError(f"input.format: {other.input_format!r} input needs kind = {other.name!r}")
        if self.model.name is not None and self.model.path is not None:
            raise ValueError("model.path: give model.name or model.path, not both")
        clash = sorted(RESERVED_COLUMNS & set(self.input.passthrough))
        if clash:
            raise ValueError(f"input.passthrough: {clash} clash with output columns")
        kind.check(self)
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

    @property
    def options(self) -> BaseModel | None:
        """The kind's options: its table, else its defaults (None: the kind takes none)."""
        return job_kind(self.kind).options(self)

    def to_plan(self, job_id: str | None = None, *, read_only: bool = False) -> JobPlan:
        """The JobPlan workers execute. A kind may read its input here (an OpenAI batch request
        file is validated and converted, written under the output); ``read_only`` (for status)
        writes nothing."""
        kind = job_kind(self.kind)
        openai_output = self.output.openai_format
        if openai_output is None:
            openai_output = kind.openai_output
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
            else 1.0 if kind.errors_are_results else DEFAULT_MAX_ERROR_FRACTION,
            max_error_rows=self.output.max_error_rows,
        )
        values.update(kind.plan_fields(self, read_only=read_only))
        if openai_output:
            from jobs.openai_merge import merge_options

            values["stage_options"] = {**values.get("stage_options", {}), **merge_options()}
        return JobPlan(**values)
