"""The ``[model]`` and ``[sampling]`` tables, derived from ``engine.EngineConfig`` and
``engine.SamplingParams``: one key per engine field, of the field's type, so the spec and
the engine cannot drift apart. What a spec adds is listed here and kept short: checks the
engine leaves to run time (so a bad value fails at load time with its path), and the
batch-job defaults of ``[sampling]``. ``[model]`` keys default to unset: the worker's
engine default applies.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_type_hints

from pydantic import Field, ValidationInfo, create_model, field_validator, model_validator

from engine.config import EngineConfig
from engine.hub_models import is_hub_id
from engine.model_registry import DEFAULT_MODEL, PACKAGED_MODELS
from engine.sampling_params import MAX_N, MAX_STOP, SamplingParams
from jobs.sections import Section, resolve_local

# Batch jobs decode greedily (reproducible) and leave room for a paragraph.
BATCH_SAMPLING_DEFAULTS: dict[str, Any] = {"max_tokens": 128, "temperature": 0.0}
# SamplingParams fields a spec does not set: the kinds (scoring, extraction) and OpenAI
# request lines set them per request.
PER_REQUEST_SAMPLING = frozenset({"logprobs", "prompt_logprobs", "prompt_logprobs_start", "structured_output"})
# Where the engine takes any string, the spec names the choices.
ENGINE_CHOICES: dict[str, Any] = {
    "dtype": Literal["float32", "bfloat16", "float16", "auto"],
    "quantization": Literal["auto", "none"],
    "kv_cache_dtype": Literal["auto", "fp8"],
    "attention_backend": Literal["auto", "torch", "triton"],
    "scheduling": Literal["continuous", "static"],
    "kv_allocation": Literal["paged", "contiguous"],
}
# Bounds checked at load time (pydantic Field arguments).
ENGINE_BOUNDS: dict[str, dict[str, Any]] = {
    "block_size": {"ge": 1}, "max_num_seqs": {"ge": 1}, "max_num_batched_tokens": {"ge": 1},
    "num_kv_blocks": {"ge": 1}, "kv_cache_memory_gb": {"gt": 0}, "gpu_memory_utilization": {"gt": 0, "le": 1},
    "max_model_len": {"ge": 1}, "num_threads": {"ge": 1}, "tensor_parallel_size": {"ge": 1},
}
SAMPLING_BOUNDS: dict[str, dict[str, Any]] = {
    "max_tokens": {"ge": 1}, "temperature": {"ge": 0}, "top_p": {"gt": 0, "le": 1}, "top_k": {"ge": -1},
    "n": {"ge": 1, "le": MAX_N, "description": "samples per row (kinds generate and evaluate): a list column"},
    "stop": {"max_length": MAX_STOP},
    "beam_width": {"ge": 1, "le": MAX_N, "description": "beam search with this many beams; the row gets the best "
                   "(n: the n best)"},
}
SAMPLING_CHOICES: dict[str, Any] = {"early_stopping": bool | Literal["never"]}
# Left out of a plan at their defaults, so plans from before they existed keep their fingerprints.
PLAN_DEFAULTS: dict[str, Any] = {"n": 1, "beam_width": None, "length_penalty": 1.0, "early_stopping": False}


class _ModelTable(Section):
    """The model and the engine settings (``engine.EngineConfig`` fields); unset keeps the engine default."""

    name: str | None = Field(None, description=f"a packaged model name (default {DEFAULT_MODEL!r}) or a Hugging "
                             "Face Hub id 'org/name' (resolved through the Hub cache; see revision)")
    path: str | None = Field(None, description="a local model directory instead of a name")

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str | None) -> str | None:
        """Caught here, not as a traceback on a worker after submit (a Hub id's snapshot is looked up
        where the engine runs, whose cache may differ from this one's)."""
        if name is not None and name not in PACKAGED_MODELS and not is_hub_id(name):
            known = ", ".join(sorted(PACKAGED_MODELS))
            raise ValueError(f"unknown model {name!r}; packaged: {known}, or a Hub id 'org/name' (or give model.path)")
        return name

    @field_validator("block_size", check_fields=False)
    @classmethod
    def _power_of_two(cls, value: int | None) -> int | None:
        if value is not None and value & (value - 1):
            raise ValueError(f"must be a power of two, got {value}")
        return value

    @field_validator("path")
    @classmethod
    def _resolve(cls, path: str | None, info: ValidationInfo) -> str | None:
        return resolve_local(path, info) if path else path

    def engine_settings(self) -> dict[str, Any]:
        """EngineConfig keyword arguments: the model plus every setting given."""
        settings = self.model_dump(exclude={"name", "path"}, exclude_none=True)
        return {"model": self.path or self.name or DEFAULT_MODEL, **settings}


class _SamplingTable(Section):
    """``engine.SamplingParams`` fields. Batch jobs default to greedy decoding (reproducible)."""

    def plan_values(self) -> dict[str, Any]:
        """SamplingParams fields for the plan; ``n`` and the beam settings only when set, so older
        plans keep their fingerprints."""
        values = self.model_dump()
        return {k: v for k, v in values.items() if k not in PLAN_DEFAULTS or v != PLAN_DEFAULTS[k]}

    @model_validator(mode="after")
    def _beam_search(self) -> _SamplingTable:
        """Beam search's checks across keys (n, stop) at load time, not as a row error on a worker."""
        if getattr(self, "beam_width", None) is not None:
            SamplingParams(**self.plan_values())
        return self

    @field_validator("stop", mode="before", check_fields=False)
    @classmethod
    def _one_stop(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("stop", check_fields=False)
    @classmethod
    def _non_empty(cls, value: list[str]) -> list[str]:
        if any(not s for s in value):
            raise ValueError("stop strings must not be empty")
        return value


def _model_fields() -> dict[str, Any]:
    """Every EngineConfig field but ``model`` (that is ``name`` or ``path``), optional, unset by default."""
    hints = get_type_hints(EngineConfig)
    return {
        f.name: (ENGINE_CHOICES.get(f.name, hints[f.name]) | None, Field(None, **ENGINE_BOUNDS.get(f.name, {})))
        for f in dataclasses.fields(EngineConfig) if f.name != "model"
    }


def _sampling_fields() -> dict[str, Any]:
    """Every SamplingParams field a spec sets, with the engine's default unless batch jobs override it."""
    hints = get_type_hints(SamplingParams)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(SamplingParams):
        if f.name in PER_REQUEST_SAMPLING:
            continue
        checks = SAMPLING_BOUNDS.get(f.name, {})
        if f.name in BATCH_SAMPLING_DEFAULTS:
            default = Field(BATCH_SAMPLING_DEFAULTS[f.name], **checks)
        elif f.default_factory is not dataclasses.MISSING:
            default = Field(default_factory=f.default_factory, **checks)
        else:
            default = Field(f.default, **checks)
        out[f.name] = (SAMPLING_CHOICES.get(f.name, hints[f.name]), default)
    return out


ModelSection: type[_ModelTable] = create_model(
    "ModelSection", __base__=_ModelTable, __module__=__name__, __doc__=_ModelTable.__doc__, **_model_fields()
)
SamplingSection: type[_SamplingTable] = create_model(
    "SamplingSection", __base__=_SamplingTable, __module__=__name__, __doc__=_SamplingTable.__doc__,
    **_sampling_fields()
)
