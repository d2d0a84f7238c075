"""Running a job kind's summary and report stages over the finished parts.

The summary stage is called as ``fn(table: pa.Table, options: dict) -> dict`` (JSON-safe), with
the rows of every done/skipped part but only the small columns (id, error,
finish_reason, token counts, latency and the kind's extra columns): output text
and passthrough fields are left out so a large job's summary fits in memory. Its
result goes into the manifest under ``summary``; a failing stage is reported there
and does not fail the job. ``options`` are the plan's ``stage_options`` plus, under
``OUTPUT_KEY``, where the job's output is: ``{"url", "storage_options", "parts"}`` with
the part ids of the done and skipped shards in shard order (the parts of this job, and
only those: the folder may hold others until the run is published).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pyarrow as pa

from connectors import read_part_columns
from pipeline.kind_stages import Stage
from pipeline.output_schema import output_schema
from pipeline.plan import JobPlan
from pipeline.shard_outcome import ShardOutcome, ShardState

log = logging.getLogger(__name__)

SUMMARY_COLUMNS = ("id", "error", "finish_reason", "prompt_tokens", "output_tokens", "cached_prompt_tokens", "latency_s")
OUTPUT_KEY = "job_output"


def job_parts(outcomes: list[ShardOutcome]) -> list[str]:
    """Part ids of the done and skipped shards, in shard order."""
    kept = sorted((o for o in outcomes if o.state in (ShardState.DONE, ShardState.SKIPPED)), key=lambda o: o.index)
    return [o.part or "" for o in kept]


def read_small_columns(plan: JobPlan, parts: list[str]) -> pa.Table:
    columns = [*SUMMARY_COLUMNS, *plan.extra_columns]
    table = read_part_columns(plan.output_url, parts, columns, plan.output_options)
    if table is None:
        schema = output_schema(plan)
        return pa.schema([schema.field(c) for c in columns]).empty_table()
    return table


def run_report(plan: JobPlan, manifest: dict[str, Any]) -> dict[str, str] | None:
    """Files the job kind writes next to its parts (e.g. report.md); a failure is reported, not raised.
    Called once the job's manifest is built, in embedded and fleet runs alike; the urls go in it."""
    stage: Stage | None = plan.kind_stages().report_stage(plan)
    if stage is None:
        return None
    try:
        written = stage.run(manifest, plan.output_options)
        return {str(k): str(v) for k, v in written.items()}
    except Exception as exc:
        log.exception("report hook %s failed", stage.name)
        return {"error": f"report hook {stage.name} failed: {type(exc).__name__}: {exc}"}


def run_summary(plan: JobPlan, outcomes: list[ShardOutcome]) -> Any:
    stage: Stage | None = plan.kind_stages().summary_stage(plan)
    if stage is None:
        return None
    try:
        parts = job_parts(outcomes)
        table = read_small_columns(plan, parts)
        output = {"url": plan.output_url, "storage_options": plan.output_options, "parts": parts}
        summary = stage.run(table, {**plan.stage_options, OUTPUT_KEY: output})
        json.dumps(summary)  # must be JSON-safe to go in the manifest
        return summary
    except Exception as exc:
        log.exception("summary hook %s failed", stage.name)
        return {"error": f"summary hook {stage.name} failed: {type(exc).__name__}: {exc}"}
