"""The start and the end of a run's output, in an order a downstream reader can trust.

``_SUCCESS`` describes one run. ``begin_output`` removes the marker of an earlier run
before this run replaces any part. ``publish`` then removes the parts that no longer
belong to the job (their input is gone), writes the manifest (the authority on which
parts belong), and writes ``_SUCCESS`` last, only when that manifest says succeeded. Only
the run holding the output's lease publishes (``pipeline.output_lease``).
"""

from __future__ import annotations

import logging
from typing import Any

from connectors import remove_stale_parts, remove_success_marker, write_manifest, write_success_marker
from pipeline.output_lease import hold_to_publish, release_output
from pipeline.plan import JobPlan
from pipeline.shard_outcome import ShardOutcome

log = logging.getLogger(__name__)


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
    write_manifest(plan.output_url, manifest, plan.output_options)
    if manifest["success_marker"]:
        write_success_marker(plan.output_url, plan.output_options)
