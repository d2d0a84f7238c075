"""The job manifest (``_manifest.json``): what ran, on what, and how each shard ended.

Job status: ``succeeded`` when every shard is done or skipped (the only case that also
writes ``_SUCCESS``); ``completed_with_errors`` when some shard failed (its reason is
listed, the other parts are valid, a re-run redoes only the missing parts);
``cancelled`` when the job was cancelled; ``failed`` when the fleet lost the job (see
``tokenmill.job_failed``) or when its error rows pass the plan's error budget (set when the
manifest is published: ``pipeline.error_budget``). Fewer error rows are counted only.

Nothing from ``storage_options`` or ``stage_options`` is written, and URLs (in reasons
too) lose any ``user:password@`` part.

The manifest is the authority on which parts belong to the job: each shard names its
part, by id (``part``, an id that does not move when other inputs come and go) and by file
(``part_file``, ``part-<id>.parquet``), and ``parts`` lists the files of done and skipped
shards, in shard order (manifests of earlier versions have the file name in ``part``:
``pipeline.shard_outcome.entry_part_id`` reads both). Readers take the parts
listed there, not whatever ``part-*`` files the folder holds. ``part_commit`` is the id in
each part's footer (its identity beyond the name): a part another run replaced has another.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from connectors import part_name, public_url
from engine.model_registry import DEFAULT_MODEL
from pipeline.job_status import JobStatus
from pipeline.kind_stages import stage_name
from pipeline.plan import JobPlan
from pipeline.shard_outcome import (
    FINAL_SHARD_STATES,
    ShardOutcome,
    ShardState,
    entry_has_part,
    entry_part_file,
)

log = logging.getLogger(__name__)

_SHARD_FIELDS = (
    "index", "url", "part", "part_file", "status", "rows", "errors", "reason", "prompt_tokens", "output_tokens",
    "cached_prompt_tokens", "seconds", "worker", "rows_resumed", "rows_reused", "rows_shared", "part_commit",
    "output_tokens_computed",
)
_COUNTERS = (
    "prompt_tokens_computed", "decode_tokens", "prefix_cache_query_tokens", "prefix_cache_hit_tokens",
    "preemptions", "steps",
)


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def final_status(outcomes: list[ShardOutcome], cancelled: bool = False) -> JobStatus:
    """The job's status from its shards' outcomes (see the module docstring)."""
    states = {o.state for o in outcomes}
    if cancelled or ShardState.CANCELLED in states:
        return JobStatus.CANCELLED
    if ShardState.FAILED in states:
        return JobStatus.COMPLETED_WITH_ERRORS
    return JobStatus.SUCCEEDED


def row_sources(outcomes: list[ShardOutcome]) -> dict[str, int]:
    """Where the output's rows came from; they add up to ``rows``: computed by this run, taken
    from a checkpoint, from the previous part, from an identical row, or in a part already current."""
    done = [o for o in outcomes if o.state == ShardState.DONE]
    taken = {k: sum(getattr(o, k) for o in done) for k in ("rows_resumed", "rows_reused", "rows_shared")}
    return {
        "rows_computed": sum(o.counts.rows for o in done) - sum(taken.values()), **taken,
        "rows_current": sum(o.counts.rows for o in outcomes if o.state == ShardState.SKIPPED),
    }


def engine_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Counters for one run on an engine that may have served earlier runs (peaks are lifetime)."""
    out = {k: after[k] - before.get(k, 0) for k in _COUNTERS}
    running = after["mean_running_seqs"] * after["steps"] - before.get("mean_running_seqs", 0) * before.get("steps", 0)
    out["mean_running_seqs"] = running / out["steps"] if out["steps"] else 0.0
    for k in ("kv_blocks_total", "kv_blocks_peak_used", "kv_peak_usage", "kv_waste_at_peak", "peak_running_seqs"):
        out[k] = after[k]
    return out


def _worker_engine_stats(outcomes: list[ShardOutcome]) -> dict[str, dict[str, Any]]:
    """Each worker's engine counters as of its last shard here (they count from the engine's
    start, so on a worker that served only this job they describe the job's batches)."""
    latest: dict[str, dict[str, Any]] = {}
    for o in outcomes:
        engine, worker = o.engine_counters, o.worker
        if worker and "steps" in engine and engine["steps"] >= latest.get(worker, {}).get("steps", -1):
            latest[worker] = {k: engine[k] for k in ("steps", "mean_running_seqs", "kv_peak_usage", "preemptions")
                              if k in engine}
    return dict(sorted(latest.items()))


def _shard_entry(outcome: ShardOutcome) -> dict[str, Any]:
    result = outcome.to_result_dict()
    result["part_file"] = part_name(result["part"]) if result["part"] else None
    entry = {k: result[k] for k in _SHARD_FIELDS}
    entry["url"] = public_url(entry["url"] or "")
    entry["reason"] = public_url(entry["reason"]) if entry["reason"] else entry["reason"]
    return entry


def build_manifest(
    plan: JobPlan,
    outcomes: list[ShardOutcome],
    *,
    mode: str,
    started_at: str,
    elapsed_s: float,
    engine_stats: dict[str, Any] | None = None,
    summary: Any = None,
    cancelled: bool = False,
) -> dict[str, Any]:
    kind = plan.kind_stages()
    outcomes = sorted(outcomes, key=lambda o: o.index)
    shards = [_shard_entry(o) for o in outcomes]
    count = {s.value: sum(o.state == s for o in outcomes) for s in FINAL_SHARD_STATES}
    counts = [o.counts.to_dict() for o in outcomes]
    totals = {
        "shards": len(outcomes),
        **{f"shards_{k}": v for k, v in count.items()},
        **{k: sum(c[k] for c in counts) for k in ("rows", "errors", "prompt_tokens", "output_tokens",
                                                   "cached_prompt_tokens")},
    }
    done = [o for o in outcomes if o.state == ShardState.DONE]
    totals.update(row_sources(outcomes))
    # tokens/s of this run's work: the engine's own count when it is this run's (embedded), else
    # what the done shards computed (a fleet job; a shard result of an older worker: all its tokens)
    computed_tokens = (engine_stats or {}).get("decode_tokens", sum(
        o.counts.output_tokens if o.output_tokens_computed is None else o.output_tokens_computed for o in done))
    stats: dict[str, Any] = {
        "elapsed_s": round(elapsed_s, 3),
        "output_tokens_per_s": round(computed_tokens / elapsed_s, 2) if elapsed_s else 0.0,
        "rows_per_s": round(sum(o.counts.rows for o in done) / elapsed_s, 2) if elapsed_s else 0.0,
        "prefix_cache_hit_tokens": sum(o.counts.cached_prompt_tokens for o in done),
        "kv_peak_usage": max((o.engine_counters.get("kv_peak_usage", 0.0) for o in outcomes), default=0.0),
        "workers": sorted({o.worker for o in done if o.worker}),
        "worker_engine_stats": _worker_engine_stats(done),
    }
    if engine_stats:
        stats.update(engine_stats)
    state = final_status(outcomes, cancelled)
    return {
        "job_id": plan.job_id,
        "name": plan.name,
        "kind": plan.kind,
        "status": state.value,
        "mode": mode,
        "input_url": public_url(plan.input_url),
        "output_url": public_url(plan.output_url),
        "model": plan.engine_settings.get("model", DEFAULT_MODEL),
        "engine": dict(plan.engine_settings),
        "sampling": dict(plan.sampling),
        "prompt": {
            "system": plan.prompt.system,
            "user_template": plan.prompt.user_template,
            "few_shot_turns": len(plan.prompt.few_shot),
            "prompt_field": plan.prompt.prompt_field,
            "messages_field": plan.prompt.messages_field,
        },
        "hooks": {"row_hook": stage_name(kind.row_stage(plan)), "summary_hook": stage_name(kind.summary_stage(plan))},
        "started_at": started_at,
        "finished_at": utc_now(),
        "shards": shards,
        "parts": [entry_part_file(s) for s in shards if entry_has_part(s)],  # file names
        "totals": totals,
        "engine_stats": stats,
        "summary": summary,
        "openai_output": plan.openai_output,
        "success_marker": state == JobStatus.SUCCEEDED,
        "plan": plan.plan_digest(),  # whose parts these are: status of another spec ignores this manifest
    }
