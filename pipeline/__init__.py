"""Executing a JobPlan: embedded in this process, or as a Celery fleet.

Names are imported lazily so ``import pipeline.plan`` (what ``jobs/`` needs at spec time)
does not pull in torch or Celery.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "JobPlan": "pipeline.plan",
    "PromptPlan": "pipeline.plan",
    "TemplateError": "pipeline.prompts",
    "validate_template": "pipeline.prompts",
    "validate_prompt": "pipeline.prompts",
    "render_messages": "pipeline.prompts",
    "RowRejected": "pipeline.kind_stages",
    "Stage": "pipeline.kind_stages",
    "SchemaError": "pipeline.output_schema",
    "output_schema": "pipeline.output_schema",
    "ShardOutcome": "pipeline.shard_outcome",
    "ShardState": "pipeline.shard_outcome",
    "JobStatus": "pipeline.job_status",
    "ShardDriver": "pipeline.shard_driver",
    "get_engine": "pipeline.engine_cache",
    "run_embedded": "pipeline.job_runner",
    "submit_job": "pipeline.fleet",
    "job_status": "pipeline.fleet",
    "cancel_job": "pipeline.fleet",
    "wait_for_job": "pipeline.fleet",
    "start_worker": "pipeline.worker",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
