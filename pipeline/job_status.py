"""A job's status: one enum for the fleet, the manifest, the console and the service.

The values are public (job manifests, ``job_status`` output, the service's job records),
so they stay as they are. A shard's own states are ``pipeline.shard_outcome.ShardState``.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    FINALIZING = "finalizing"  # every shard ended, the manifest is being written
    CANCELLING = "cancelling"  # cancel asked, shards still stopping
    SUCCEEDED = "succeeded"  # every shard done or skipped (the only status that writes _SUCCESS)
    COMPLETED_WITH_ERRORS = "completed_with_errors"  # some shard failed; the other parts are valid
    CANCELLED = "cancelled"
    FAILED = "failed"  # the fleet lost the job, or its error rows passed the budget (manifest "error")


FINAL_JOB_STATUSES = (JobStatus.SUCCEEDED, JobStatus.COMPLETED_WITH_ERRORS, JobStatus.CANCELLED, JobStatus.FAILED)
