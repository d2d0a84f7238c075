"""Running a job kind's summary hook over the finished parts.

The hook is called as ``fn(table: pa.Table, options: dict) -> dict`` (JSON-safe), with
the rows of every done/skipped part but only the small columns (id, error,
finish_reason, token counts, latency and the kind's extra columns): output text
and passthrough fields are left out so a large job's summary fits in memory. Its
result goes into the manifest under ``summary``; a failing hook is reported there
and does not fail the job.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pyarrow as pa

from connectors import read_part_columns
from pipeline.hooks import load_hook
from pipeline.output_schema import output_schema
from pipeline.plan import JobPlan

log = logging.getLogger(__name__)

SUMMARY_COLUMNS = ("id", "error", "finish_reason", "prompt_tokens", "output_tokens", "cached_prompt_tokens", "latency_s")


def read_small_columns(plan: JobPlan, indices: list[int]) -> pa.Table:
    columns = [*SUMMARY_COLUMNS, *plan.extra_columns]
    table = read_part_columns(plan.output_url, indices, columns, plan.storage_options)
    if table is None:
        schema = output_schema(plan)
        return pa.schema([schema.field(c) for c in columns]).empty_table()
    return table


def run_report_hook(plan: JobPlan, manifest: dict[str, Any]) -> dict[str, str] | None:
    """Files the job kind writes next to its parts (e.g. report.md); a failure is reported, not raised."""
    if not plan.report_hook:
        return None
    try:
        written = load_hook(plan.report_hook)(manifest, plan.storage_options)
        return {str(k): str(v) for k, v in written.items()}
    except Exception as exc:
        log.exception("report hook %s failed", plan.report_hook)
        return {"error": f"report hook {plan.report_hook} failed: {type(exc).__name__}: {exc}"}


def run_summary_hook(plan: JobPlan, results: list[dict[str, Any]]) -> Any:
    if not plan.summary_hook:
        return None
    try:
        fn = load_hook(plan.summary_hook)
        table = read_small_columns(plan, [r["index"] for r in results if r["status"] in ("done", "skipped")])
        summary = fn(table, dict(plan.hook_options))
        json.dumps(summary)  # must be JSON-safe to go in the manifest
        return summary
    except Exception as exc:
        log.exception("summary hook %s failed", plan.summary_hook)
        return {"error": f"summary hook {plan.summary_hook} failed: {type(exc).__name__}: {exc}"}
