"""What a worker needs to process a job's shards: plain, JSON-safe data.

``jobs/`` builds a ``JobPlan`` from a user's spec; ``pipeline/`` executes it. Nothing
here parses specs or touches storage formats.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.kind_registry import plan_kind
from pipeline.kind_stages import KindStages, stage_name

# Plan fields that change what a part holds; a part written under other values is stale.
_OUTPUT_FIELDS = (
    "kind", "input_format", "id_field", "text_field", "passthrough_fields", "prompt", "sampling",
    "truncate_prompt", "stage_options", "extra_columns", "openai_output",
)
# Fields renamed since parts were first fingerprinted: hashed under their first name, so parts stay current.
_FINGERPRINT_NAMES = {"stage_options": "hook_options"}
# The request mode of a plan whose rows are one generation each (the engine's own request; a
# kind names its other modes and their shapes, pipeline.kind_stages).
DEFAULT_REQUEST_MODE = "generate"
# Also shaping, but only counted when set, so plans that do not use them keep their fingerprints.
_OPTIONAL_OUTPUT_FIELDS = {"request_mode": DEFAULT_REQUEST_MODE, "mode_options": {}, "sampling_field": None}
_OUTPUT_ENGINE_FIELDS = ("model", "dtype", "max_model_len")
# Plan fields of earlier versions that the kind now derives: ignored when a plan is read back.
_DERIVED_FIELDS = ("row_hook", "summary_hook", "report_hook")
_RENAMED_FIELDS = {"hook_options": "stage_options", "engine": "engine_settings"}  # earlier name -> now
# A shard commits its finished rows at least this often (pipeline.part_sink): a reclaimed worker
# loses at most two minutes of a shard's rows plus those in flight, and a checkpoint (a few
# small object writes) comes seldom enough to cost well under 1% of a worker's time. The row
# bound caps the rows held in memory for the next chunk (about a minute of a fast GPU's rows).
DEFAULT_CHECKPOINT_ROWS = 5000
DEFAULT_CHECKPOINT_SECONDS = 120.0
# A job whose rows failed more than this often ends ``failed`` (pipeline.error_budget): more
# than half the rows erring is a systematic fault (a wrong field, template or model), never a
# few bad documents. OpenAI batches keep their own rule (errors go to the error file): 1.0.
DEFAULT_MAX_ERROR_FRACTION = 0.5


@dataclass
class PromptPlan:
    """How a row becomes chat messages: a shared system instruction (and few-shot turns,
    part of the shared prefix), then the user turn rendered from ``user_template``
    with ``{field}`` placeholders filled from the row (plain names only)."""

    system: str = ""
    user_template: str = "{text}"
    few_shot: list[dict[str, str]] = field(default_factory=list)  # [{"role": ..., "content": ...}]
    prompt_field: str | None = None  # the row's column is the whole user turn, sent as written
    messages_field: str | None = None  # OpenAI batch input: the row carries its own messages
    raw_prompt: bool = False  # OpenAI /v1/completions: the last turn's text is the whole prompt, no template


@dataclass
class JobPlan:
    job_id: str
    name: str
    kind: str  # the job kind's name: its registered class owns its stages (pipeline.kind_stages)
    input_url: str
    output_url: str
    input_format: str | None = None  # None: from the file names
    id_field: str | None = None
    text_field: str = "text"
    passthrough_fields: list[str] = field(default_factory=list)
    # fsspec options of the input, and of the output (None: the input's). Never logged or written
    # out; a plan sent to a fleet holds only "${env:NAME}" references and profile names.
    storage_options: dict[str, Any] = field(default_factory=dict)
    output_storage_options: dict[str, Any] | None = None
    split_row_groups: bool = False
    prompt: PromptPlan = field(default_factory=PromptPlan)
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingParams fields
    engine_settings: dict[str, Any] = field(default_factory=dict)  # EngineConfig fields (model, dtype, ...)
    truncate_prompt: bool = False  # cut over-long prompts instead of erroring the row
    stage_options: dict[str, Any] = field(default_factory=dict)  # the kind's options for its stages
    extra_columns: dict[str, str] = field(default_factory=dict)  # name -> arrow type ("float64", "string", "bool")
    openai_output: bool = False  # also write OpenAI batch output JSONL lines
    # How a row becomes engine requests: the kind's request shape for this mode (pipeline.row_requests);
    # mode_options configure it.
    request_mode: str = DEFAULT_REQUEST_MODE
    mode_options: dict[str, Any] = field(default_factory=dict)
    sampling_field: str | None = None  # a row column of per-row SamplingParams overrides
    # Checkpoints inside a shard: every this many finished rows or seconds (0: that trigger off;
    # both 0: none). They do not shape rows, so they are not in the part fingerprint.
    checkpoint_rows: int = DEFAULT_CHECKPOINT_ROWS
    checkpoint_seconds: float = DEFAULT_CHECKPOINT_SECONDS
    # The error budget: more error rows than this fraction of the output's rows (or than
    # ``max_error_rows``, when set) fail the job. Not in the part fingerprint: it shapes no row.
    max_error_fraction: float = DEFAULT_MAX_ERROR_FRACTION
    max_error_rows: int | None = None

    def __post_init__(self) -> None:
        self.request_mode = str(self.request_mode)
        # a kind the registry does not hold, or a request mode the kind has no shape for, is refused
        # here, before any work
        self.kind_stages().request_shape(self)

    def kind_stages(self) -> KindStages:
        """The plan's job kind, which gives its request shape and its row, summary and report stages."""
        return plan_kind(self.kind)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def checkpoints(self) -> bool:
        return self.checkpoint_rows > 0 or self.checkpoint_seconds > 0

    @property
    def output_options(self) -> dict[str, Any]:
        """Storage options for everything under ``output_url``."""
        return self.storage_options if self.output_storage_options is None else self.output_storage_options

    def part_fingerprint(self, input_fingerprint: str) -> str:
        """What a part records to be reused: its input shard plus everything in the plan that
        shapes its rows, so a re-run with another prompt, model or sampling recomputes."""
        data = self.to_dict()
        shaping = {_FINGERPRINT_NAMES.get(k, k): data[k] for k in _OUTPUT_FIELDS}
        shaping["row_hook"] = stage_name(self.kind_stages().row_stage(self))  # the row stage shapes the kind's columns
        if not self.prompt.raw_prompt:  # added later: absent when off, so earlier parts stay current
            shaping["prompt"] = {k: v for k, v in shaping["prompt"].items() if k != "raw_prompt"}
        shaping.update({k: data[k] for k, default in _OPTIONAL_OUTPUT_FIELDS.items() if data[k] != default})
        shaping["engine"] = {k: self.engine_settings.get(k) for k in _OUTPUT_ENGINE_FIELDS}  # key as first spelled
        digest = hashlib.sha256(json.dumps(shaping, sort_keys=True, default=str).encode()).hexdigest()[:16]
        return f"{input_fingerprint}|plan={digest}"

    def plan_digest(self) -> str:
        """What of this plan shapes its rows, as a short digest (the manifest records it)."""
        return self.part_fingerprint("").removeprefix("|plan=")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobPlan:
        data = {_RENAMED_FIELDS.get(k, k): v for k, v in data.items() if k not in _DERIVED_FIELDS}
        data["prompt"] = PromptPlan(**data.get("prompt", {}))
        return cls(**data)
