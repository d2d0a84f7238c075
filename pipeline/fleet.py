"""Client side of the fleet: submit a job as a chord of shard tasks, watch it, cancel it.

Shards are listed once, at submit time, so every worker agrees on the numbering. Job
state lives in Redis (see ``pipeline.job_state``) and is readable while the job runs;
a job that ran embedded (no Redis state) is described from its manifest and parts.

Nothing secret goes on the broker: a plan whose storage options hold a literal credential,
or whose URLs carry ``user:password@``, is refused before anything is queued. Workers get
credentials from their own environment (``"${env:NAME}"`` references, AWS_* variables,
instance roles) or a named profile.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

from celery import Celery, chord

from connectors import (
    CredentialError,
    ShardRef,
    has_userinfo,
    list_shards,
    literal_credentials,
)
from pipeline.celery_app import DEFAULT_BROKER_URL, DEFAULT_QUEUE, DEFAULT_RESULT_BACKEND, make_app
from pipeline.job_cancel import OUTPUT_META, cancel_in_store
from pipeline.job_progress import job_progress
from pipeline.job_state import JobStateStore
from pipeline.job_status import FINAL_JOB_STATUSES, JobStatus
from pipeline.manifest import public_url, utc_now
from pipeline.output_lease import FLEET_TTL_S, release_output, take_output
from pipeline.output_status import status_from_output
from pipeline.plan import JobPlan
from pipeline.publish import begin_output
from pipeline.queue_check import warn_if_unconsumed
from pipeline.shard_outcome import FINAL_SHARD_STATES, ShardState


def _client_app(
    broker_url: str | None, result_backend: str | None, queue: str | None, redis_key_prefix: str | None = None
) -> Celery:
    """An app publishing to that fleet. Settings not given are resolved from the environment now,
    so a cached app never carries another fleet's broker, queue or key prefix."""
    env = os.environ.get
    return _cached_app(
        broker_url or env("TOKENMILL_BROKER_URL") or DEFAULT_BROKER_URL,
        result_backend or env("TOKENMILL_RESULT_BACKEND") or DEFAULT_RESULT_BACKEND,
        queue or env("TOKENMILL_QUEUE") or DEFAULT_QUEUE,
        redis_key_prefix if redis_key_prefix is not None else env("TOKENMILL_REDIS_KEY_PREFIX", ""),
    )


@functools.lru_cache(maxsize=8)
def _cached_app(broker_url: str, result_backend: str, queue: str, redis_key_prefix: str) -> Celery:
    return make_app(broker_url, result_backend, queue, redis_key_prefix)


def check_no_secrets(plan: JobPlan) -> None:
    """Raise CredentialError if the plan would carry a credential through the broker."""
    found = literal_credentials(plan.storage_options, "input.storage_options")
    if plan.output_storage_options is not None:
        found += literal_credentials(plan.output_storage_options, "output.storage_options")
    found += literal_credentials(plan.stage_options, "stage_options")
    if found:
        raise CredentialError(
            f"{', '.join(found)}: a credential in the spec would travel to the workers through the broker; "
            "give it as \"${env:NAME}\" (read from each worker's environment), a profile, or the workers' "
            "own AWS_* variables / instance role"
        )
    for name, url in (("input.url", plan.input_url), ("output.url", plan.output_url)):
        if has_userinfo(url):
            raise CredentialError(
                f"{name}: user:password@ in the URL would travel to the workers through the broker; "
                "give credentials to the workers through their environment or storage_options references"
            )


def submit_job(
    plan: JobPlan,
    broker_url: str | None = None,
    *,
    result_backend: str | None = None,
    queue: str | None = None,
    state_url: str | None = None,
    redis_key_prefix: str | None = None,
) -> str:
    """List the input shards and queue one task per shard plus the finalizer; returns the job id.

    The job takes the output's lease first (``OutputLeased`` names a live run holding it); an
    earlier run's ``_SUCCESS`` is removed before anything is queued. ``redis_key_prefix``
    must match the workers' TOKENMILL_REDIS_KEY_PREFIX (default: this process's environment)."""
    check_no_secrets(plan)
    shards = list_shards(
        plan.input_url, format=plan.input_format, storage_options=plan.storage_options,
        split_row_groups=plan.split_row_groups,
    )
    take_output(plan, "fleet job", FLEET_TTL_S, this_process=False)
    try:
        return _queue_job(plan, shards, broker_url, result_backend, queue, state_url, redis_key_prefix)
    except BaseException:
        release_output(plan)
        raise


def _queue_job(
    plan: JobPlan, shards: list[ShardRef], broker_url: str | None, result_backend: str | None, queue: str | None,
    state_url: str | None, redis_key_prefix: str | None,
) -> str:
    app = _client_app(broker_url, result_backend, queue, redis_key_prefix)
    queue_name = app.conf.task_default_queue
    warn_if_unconsumed(app, queue_name, plan.job_id)  # before queueing: the answer takes a moment
    store = JobStateStore(state_url)
    store.init_job(
        plan.job_id,
        {
            "name": plan.name, "kind": plan.kind, "output_url": public_url(plan.output_url),
            "shards": len(shards), "submitted_at": time.time(), "submitted_at_iso": utc_now(),
            "status": "queued", "queue": queue_name,
            OUTPUT_META: {"url": plan.output_url, "storage_options": plan.output_options},  # no literal secret
        },
        [s.to_dict() for s in shards],
    )
    begin_output(plan)
    plan_dict = plan.to_dict()
    header = [
        app.signature("tokenmill.process_shard", args=(plan_dict, s.to_dict()), queue=queue_name) for s in shards
    ]
    body = app.signature(
        "tokenmill.finalize_job", args=(plan_dict,),
        kwargs={"shard_indices": [s.index for s in shards], "shard_parts": [s.part_id for s in shards]},
        queue=queue_name,
    )
    body.link_error(app.signature("tokenmill.job_failed", kwargs={"plan_dict": plan_dict}))
    result = chord(header, app=app)(body)
    store.set_meta(plan.job_id, finalize_task_id=result.id)
    _stop_listening(app, [result.id, *(r.id for r in getattr(result.parent, "results", None) or ())])
    return plan.job_id


def _stop_listening(app: Celery, task_ids: list[str]) -> None:
    """A submitting client never waits for results, yet the Redis backend subscribed to each queued
    task's channel; leave them now, while the process is whole, or ``AsyncResult.__del__`` does it at
    interpreter exit and prints a traceback."""
    consumer = getattr(app.backend, "result_consumer", None)
    if consumer is not None:
        for task_id in task_ids:
            consumer.cancel_for(task_id)


def job_status(job: str | JobPlan, *, state_url: str | None = None) -> dict[str, Any]:
    """Per-shard state (queued, running, done, skipped, failed, cancelled + reason) and progress.

    With a job id the live state comes from Redis; with a plan, a job unknown to Redis
    (e.g. run embedded) is described from its manifest, or from which parts exist.
    """
    plan = job if isinstance(job, JobPlan) else None
    job_id = plan.job_id if plan is not None else str(job)
    meta, shards = {}, {}
    try:
        store = JobStateStore(state_url)
        meta, shards = store.meta(job_id), store.shards(job_id)
    except Exception:
        if plan is None:
            raise
    if meta:
        return live_status(job_id, meta, shards)
    if plan is None:
        raise KeyError(f"unknown job {job_id!r}: no state in Redis (pass the JobPlan to read its output)")

    return status_from_output(plan)


def live_status(job_id: str, meta: dict[str, Any], shards: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The status dict from a job's meta and per-shard states (also used by the service's embedded runner)."""
    now = time.time()
    rows = [
        {
            "index": i, "url": s.get("url"), "state": s.get("state", "queued"), "rows_done": s.get("rows_done", 0),
            "errors": s.get("errors", 0), "output_tokens": s.get("output_tokens", 0), "reason": s.get("reason"),
            "prompt_tokens": s.get("prompt_tokens", 0), "cached_prompt_tokens": s.get("cached_prompt_tokens", 0),
            "worker": s.get("worker"), "kv_usage": s.get("kv_usage"), "prefix_hit_rate": s.get("prefix_hit_rate"),
            # a "running" shard whose worker died keeps its state until the broker redelivers it
            # (Redis: after the visibility timeout); a large value here is the hint
            "updated_s_ago": round(now - s["updated_at"], 1) if s.get("updated_at") else None,
        }
        for i, s in shards.items()
    ]
    started = [s["started_at"] for s in shards.values() if s.get("started_at")]
    finished = meta.get("finished_at")
    elapsed = ((finished or now) - min(started)) if started else 0.0
    status = meta.get("status", JobStatus.QUEUED.value)
    if status not in FINAL_JOB_STATUSES:
        if meta.get("cancel_requested_at"):
            status = JobStatus.CANCELLING.value
        elif rows and all(r["state"] in FINAL_SHARD_STATES for r in rows):
            status = JobStatus.FINALIZING.value
        elif any(r["state"] != ShardState.QUEUED for r in rows):
            status = JobStatus.RUNNING.value
    return {
        "job_id": job_id,
        "name": meta.get("name"),
        "kind": meta.get("kind"),
        "status": status,
        "output_url": meta.get("output_url"),
        "shards": rows,
        "progress": job_progress(
            rows, (ShardState.QUEUED, ShardState.RUNNING, ShardState.RETRYING, *FINAL_SHARD_STATES), elapsed,
            token_columns=("output_tokens", "prompt_tokens", "cached_prompt_tokens"), elapsed_digits=2,
        ),
    }


def cancel_job(job_id: str, *, state_url: str | None = None, release: bool = False) -> dict[str, Any]:
    """Queued shards return ``cancelled`` when they start; running ones stop within about a
    second (their in-flight rows are dropped, no part is written); the manifest says cancelled.
    A job no shard of which started is cancelled at once and its lease released; ``release``
    releases the lease of any job (``pipeline.job_cancel``). The status has ``notes`` on that."""
    store = JobStateStore(state_url)
    if not store.meta(job_id):
        raise KeyError(f"unknown job {job_id!r}")
    notes = cancel_in_store(store, job_id, release=release)
    return {**job_status(job_id, state_url=state_url), "notes": notes}


def wait_for_job(
    job_id: str, timeout: float | None, *, state_url: str | None = None, poll_s: float = 1.0
) -> dict[str, Any]:
    """Poll until the job reaches a final state; raises TimeoutError after ``timeout`` seconds
    (None: wait as long as it takes)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        status = job_status(job_id, state_url=state_url)
        if status["status"] in FINAL_JOB_STATUSES:
            return status
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {status['status']} after {timeout}s")
        time.sleep(poll_s)
