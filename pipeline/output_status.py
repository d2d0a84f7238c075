"""``tokenmill status SPEC`` for a job unknown to Redis: this spec's state, read from its output.

The output folder may hold another plan's work: run 1 succeeded, then a re-run under a new
prompt was killed after rewriting 2 of 6 parts. Its manifest (run 1's) says succeeded and
6/6 done, but only 4 parts are run 1's and none is complete for the new spec. So a shard is
``done`` only when its part is current for this plan (its footer fingerprint), the manifest
speaks only when it records this plan (``plan``) and ``succeeded`` needs ``_SUCCESS`` too;
otherwise the status is ``incomplete``, with the current parts counted. A part whose
footer commit id is not the one the manifest recorded was replaced by another run: its
shard is not ``done`` and the status is ``incomplete``. A shard without a current part shows
the rows an unfinished run of this plan checkpointed (its re-run resumes after them), and an
output with such rows or current parts but no manifest is ``incomplete``, not ``unknown``.
"""

from __future__ import annotations

from typing import Any

from connectors import (
    ShardCheckpoint,
    ShardRef,
    list_shards,
    part_is_current,
    read_manifest,
    read_part_commit,
    success_marker_exists,
)
from pipeline.job_progress import job_progress
from pipeline.manifest import public_url
from pipeline.plan import JobPlan
from pipeline.publish import replaced_reason
from pipeline.shard_outcome import FINAL_SHARD_STATES, PART_STATES, ShardState

NOT_CURRENT = "no part for this spec's plan"


def checkpointed_rows(plan: JobPlan, shard: ShardRef) -> int:
    """Rows of the shard an unfinished run of this plan committed in its checkpoint."""
    if not plan.checkpoints:
        return 0
    return ShardCheckpoint(plan.output_url, shard.part_id, plan.part_fingerprint(shard.fingerprint),
                           plan.output_options).recorded_rows()


def status_from_output(plan: JobPlan) -> dict[str, Any]:
    options = plan.output_options
    manifest = read_manifest(plan.output_url, options)
    listed = list_shards(plan.input_url, format=plan.input_format, storage_options=plan.storage_options,
                         split_row_groups=plan.split_row_groups)
    current = {s.index: part_is_current(plan.output_url, s.part_id, plan.part_fingerprint(s.fingerprint), options)
               for s in listed}
    ours = manifest is not None and (
        manifest["plan"] == plan.plan_digest() if "plan" in manifest else all(current.values()))
    recorded = {s["url"]: s for s in manifest["shards"]} if ours else {}
    rows, replaced = [], False
    for s in listed:
        entry = recorded.get(public_url(s.url), {})
        state = entry.get("status") if entry else None
        wrote = entry.get("part_commit") if current[s.index] else None
        found = read_part_commit(plan.output_url, s.part_id, options) if wrote else None
        if wrote and found != wrote:
            replaced, state, entry = True, "queued", {"reason": replaced_reason(found, wrote)}
        elif current[s.index]:
            state = state if state in PART_STATES else ShardState.DONE.value
        elif state not in ("failed", "cancelled"):
            state, entry = "queued", {"reason": NOT_CURRENT}
            saved = checkpointed_rows(plan, s)
            if saved:
                entry = {"rows": saved, "reason": f"{saved} rows checkpointed (a re-run resumes after them)"}
        rows.append({"index": s.index, "url": s.url, "state": state, "rows_done": entry.get("rows", 0),
                     "errors": entry.get("errors", 0), "output_tokens": entry.get("output_tokens", 0),
                     "reason": entry.get("reason"), "worker": entry.get("worker")})
    if manifest is None:  # a run that never finished may have left parts and checkpoints
        status = "incomplete" if any(r["rows_done"] for r in rows) or any(current.values()) else "unknown"
    elif not ours or replaced or (manifest["status"] == "succeeded" and not success_marker_exists(plan.output_url, options)):
        status = "incomplete"
    else:
        status = manifest["status"]
    elapsed = manifest.get("engine_stats", {}).get("elapsed_s", 0.0) if ours else 0.0
    return {
        "job_id": plan.job_id, "name": plan.name, "status": status, "output_url": public_url(plan.output_url),
        "shards": rows,
        "progress": job_progress(rows, (ShardState.QUEUED, ShardState.RUNNING, *FINAL_SHARD_STATES), elapsed),
    }
