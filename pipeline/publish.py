"""The start and the end of a run's output, in an order a downstream reader can trust.

``_SUCCESS`` describes one run. ``begin_output`` removes the marker of an earlier run
before this run replaces any part. ``publish`` then removes the parts that no longer
belong to the job (their input is gone), writes the manifest (the authority on which
parts belong), and writes ``_SUCCESS`` last, only when that manifest says succeeded. A part
whose footer no longer holds the commit id this run wrote (another run replaced it) is not
the job's: its shard is failed with ``REPLACED`` and no ``_SUCCESS`` is written. A job whose
error rows pass its budget is ``failed`` (``pipeline.error_budget``). Only
the run holding the output's lease publishes (``pipeline.output_lease``).
"""

from __future__ import annotations

import logging
from typing import Any

from connectors import (
    read_part_commit,
    remove_stale_parts,
    remove_success_marker,
    write_manifest,
    write_success_marker,
)
from pipeline.error_budget import apply_error_budget
from pipeline.job_status import JobStatus
from pipeline.output_lease import hold_to_publish, release_output
from pipeline.plan import JobPlan
from pipeline.shard_outcome import ShardOutcome, ShardState, entry_has_part, entry_part_file, entry_part_id

log = logging.getLogger(__name__)

REPLACED = "part replaced by another run"


def replaced_reason(found: str | None, wrote: str) -> str:
    return f"{REPLACED} (its commit is {found or 'gone'}, this run's was {wrote})"


def check_parts(plan: JobPlan, manifest: dict[str, Any]) -> None:
    """Fail the shards whose part is no longer the one this run recorded (see the docstring)."""
    replaced = 0
    for entry in manifest["shards"]:
        wrote = entry.get("part_commit")
        if not entry_has_part(entry) or not wrote:
            continue
        try:
            found = read_part_commit(plan.output_url, entry_part_id(entry), plan.output_options)
        except Exception as exc:  # cannot tell (the footer read failed after retries): keep it
            log.warning("cannot check part %s of %s: %s", entry_part_file(entry), plan.job_id, exc)
            continue
        if found != wrote:
            manifest["totals"][f"shards_{entry['status']}"] -= 1
            manifest["totals"]["shards_failed"] += 1
            entry["status"], entry["reason"] = ShardState.FAILED.value, replaced_reason(found, wrote)
            replaced += 1
    if replaced:
        log.error("job %s: %d parts were replaced by another run", plan.job_id, replaced)
        manifest["parts"] = [entry_part_file(e) for e in manifest["shards"] if entry_has_part(e)]
        manifest["success_marker"] = False
        if manifest["status"] == JobStatus.SUCCEEDED.value:
            manifest["status"] = JobStatus.COMPLETED_WITH_ERRORS.value


def begin_output(plan: JobPlan) -> None:
    """Called before any shard of a run starts (submit, or the embedded runner's start)."""
    remove_success_marker(plan.output_url, plan.output_options)


def publish(plan: JobPlan, manifest: dict[str, Any], outcomes: list[ShardOutcome], *, prune: bool = True) -> None:
    """Write the manifest and, if it says succeeded, ``_SUCCESS``.

    With ``prune`` (``outcomes`` has every shard of the run) parts of no listed shard are
    removed first. A failed shard's old part stays (a re-run may find it current), but only
    the manifest's ``parts`` belong to the job. ``OutputLeased`` (nothing written) if another
    run holds the output now.
    """
    taken_here = hold_to_publish(plan)
    try:
        _publish(plan, manifest, outcomes, prune)
    finally:
        if taken_here:
            release_output(plan)


def _publish(plan: JobPlan, manifest: dict[str, Any], outcomes: list[ShardOutcome], prune: bool) -> None:
    parts = [o.part for o in outcomes]
    if prune and parts and all(parts):
        try:
            removed = remove_stale_parts(plan.output_url, parts, plan.output_options)
            if removed:
                manifest["removed_parts"] = removed
        except Exception as exc:  # the manifest still says which parts belong; no marker though
            log.exception("cannot remove stale parts of %s", plan.job_id)
            manifest["success_marker"] = False
            manifest["error"] = f"cannot remove stale parts: {type(exc).__name__}: {exc}"
    check_parts(plan, manifest)
    apply_error_budget(plan, manifest)
    write_manifest(plan.output_url, manifest, plan.output_options)
    if manifest["success_marker"]:
        write_success_marker(plan.output_url, plan.output_options)
