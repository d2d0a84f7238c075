"""Cancelling a fleet job, and the output lease it leaves.

A job's shards stop when a worker sees the cancel flag, and its finalizer writes the
``cancelled`` manifest and releases the lease. A job that no worker ever started (its queue
has no consumer, or it was cancelled at once) has nobody to do that: it stayed
``cancelling`` and its lease (``FLEET_TTL_S``, an hour) refused the corrected resubmit. So a
cancel that finds every shard still queued for the first time ends the job here: the job is
``cancelled``, its shards too, and its lease is released. A finalizer that runs later anyway
(a worker came up) sees ``cancelled_unstarted`` and publishes nothing.

``release=True`` (``tokenmill cancel --release``) also releases the lease of a job that did
start, for an operator who knows its holders are dead; the job's own lease only.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from connectors import Lease, release_lease
from pipeline.job_state import JobStateStore
from pipeline.job_status import FINAL_JOB_STATUSES, JobStatus
from pipeline.shard_outcome import ShardState

log = logging.getLogger(__name__)

OUTPUT_META = "lease_output"  # {"url", "storage_options"}: where the job's lease is (references only)
UNSTARTED_META = "cancelled_unstarted"
UNSTARTED_REASON = "job cancelled before any shard started"


def never_started(shards: dict[int, dict[str, Any]]) -> bool:
    """Every shard queued as at submit (a handed-back shard is queued with a reason)."""
    return all(s.get("state") == ShardState.QUEUED and not s.get("reason") and not s.get("worker")
               for s in shards.values())


def release_job_lease(meta: dict[str, Any], job_id: str) -> Lease | None:
    """Release the lease ``job_id`` holds on its output, if it does; the lease removed, if any."""
    where = meta.get(OUTPUT_META)
    if not where:  # a job submitted before the output was recorded
        return None
    return release_lease(where["url"], job_id, where.get("storage_options"))


def cancel_in_store(store: JobStateStore, job_id: str, *, release: bool = False) -> list[str]:
    """Set the cancel flag; end a job that never started and release its lease (or any job's,
    with ``release``). Returns what was done beyond the flag, one line each."""
    meta = store.meta(job_id)
    store.cancel(job_id)
    notes: list[str] = []
    shards = store.shards(job_id)
    unstarted = meta.get("status") not in FINAL_JOB_STATUSES and never_started(shards)
    if unstarted:
        for index, state in shards.items():
            store.set_shard(job_id, index, {**state, "state": ShardState.CANCELLED.value, "reason": UNSTARTED_REASON})
        store.set_meta(job_id, status=JobStatus.CANCELLED.value, finished_at=time.time(), **{UNSTARTED_META: True})
        notes.append("no shard had started: the job is cancelled")
    if unstarted or release:
        released = release_job_lease(meta, job_id)
        if released is not None:
            notes.append(f"released its lease on {meta.get('output_url')} ({released.holder})")
            log.warning("job %s: %s", job_id, notes[-1])
    return notes
