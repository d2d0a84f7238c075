"""The fleet's Celery tasks: one task per shard, a chord callback that writes the manifest.

A shard task is safe to run twice: a shard whose part is already current is skipped,
so a redelivery after a worker died (or a duplicate delivery) costs one footer read.
Shard-level problems come back as a ``failed`` ShardOutcome instead of an exception, so
one bad shard never stops the chord: the manifest lists it with its reason. A shard that
failed on a transient error and will be retried is reported ``retrying``, never ``failed``,
so a finalizer fired early (a redelivered duplicate counted twice by the chord) waits for
the retry instead of taking the failure as final.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from typing import Any

from celery.exceptions import Reject

from connectors import OutputLeased, ShardRef
from pipeline import metrics
from pipeline.celery_app import app
from pipeline.engine_thread import ShardHandedBack, engine_thread
from pipeline.job_cancel import UNSTARTED_META
from pipeline.job_state import JobStateStore
from pipeline.manifest import build_manifest, utc_now
from pipeline.output_lease import heartbeat_every, release_output, renew_output
from pipeline.plan import JobPlan
from pipeline.publish import publish
from pipeline.shard_outcome import ShardOutcome, ShardState
from pipeline.summary import run_report, run_summary

log = logging.getLogger(__name__)

MAX_TRANSIENT_RETRIES = 3
FINALIZE_RETRY_S = 5
FINALIZE_MAX_RETRIES = 24 * 3600 // FINALIZE_RETRY_S
FLEET_HEARTBEAT_S = 60.0


def _worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _store() -> JobStateStore | None:
    try:
        store = JobStateStore()
        store.redis.ping()
        return store
    except Exception as exc:  # progress reporting is best effort; the shard still runs
        log.warning("job state store unavailable: %s", exc)
        return None


def will_be_retried(state: str, transient: bool, will_retry: bool) -> bool:
    """A failed shard whose task runs again: reported ``retrying``, never final."""
    return state == ShardState.FAILED and bool(transient) and will_retry


class _Reporter:
    """Writes a shard's progress to the state store at most once a second (and at the end).

    With ``will_retry`` a transient failure is written as ``retrying``: the task is about
    to run the shard again, so nobody may take that failure as the shard's end."""

    def __init__(
        self, store: JobStateStore | None, job_id: str, worker: str, part: str | None = None, will_retry: bool = False
    ) -> None:
        self.store, self.job_id, self.worker, self.part = store, job_id, worker, part
        self.will_retry = will_retry
        self.started_at = time.time()
        self._last = 0.0

    def __call__(self, p: ShardOutcome) -> None:
        self.report(p)

    def report(self, p: ShardOutcome, *, throttle: bool = True) -> None:
        """Write ``p``; a running shard's progress at most once a second unless ``throttle`` is off
        (which also leaves the next progress free to be written at once)."""
        now = time.monotonic()
        final = p.state != ShardState.RUNNING
        if self.store is None or (throttle and not final and now - self._last < 1.0):
            return
        if throttle:
            self._last = now
        state = {
            **p.to_state_dict(), "part": self.part, "worker": self.worker, "started_at": self.started_at,
            **{k: v for k, v in metrics.snapshot().items() if k in ("kv_usage", "prefix_hit_rate")},
        }
        if will_be_retried(p.state, p.transient, self.will_retry):
            state["state"] = ShardState.RETRYING.value
        if final:
            state["finished_at"] = time.time()
        try:
            self.store.set_shard(self.job_id, p.index, state)
        except Exception as exc:
            log.warning("cannot report progress of shard %d: %s", p.index, exc)


def run_shard(
    plan: JobPlan, shard: ShardRef, store: JobStateStore | None, worker: str, will_retry: bool = False
) -> ShardOutcome:
    """Run one shard in this worker's engine thread (overlapping with the worker's other
    shard tasks under the threads pool); always returns its outcome. ``will_retry``: the
    caller runs the shard again after a transient failure."""
    reporter = _Reporter(store, plan.job_id, worker, shard.part_id, will_retry)
    meter = metrics.ShardMeter(plan)
    if store is not None and store.is_cancelled(plan.job_id):
        outcome = ShardOutcome(shard.index, shard.url, ShardState.CANCELLED, reason="job cancelled", worker=worker,
                               part=shard.part_id)
        reporter(outcome)
        meter.finish(outcome)
        return outcome
    try:
        renew_output(plan)  # no lease at all (a late redelivery): the shard writes only its own part
    except OutputLeased as exc:  # another run took the output over: this job writes nothing more
        outcome = ShardOutcome(shard.index, shard.url, ShardState.FAILED, reason=str(exc), worker=worker,
                               part=shard.part_id)
        reporter(outcome)
        meter.finish(outcome)
        return outcome
    reporter.report(ShardOutcome(shard.index, shard.url, ShardState.RUNNING), throttle=False)
    should_stop = (lambda: store.is_cancelled(plan.job_id)) if store is not None else None
    heartbeat = heartbeat_every(plan, FLEET_HEARTBEAT_S)

    def on_progress(p: ShardOutcome) -> None:
        meter.progress(p)
        reporter(p)
        try:
            heartbeat()
        except Exception as exc:  # a missed heartbeat; the finalizer checks the lease anyway
            log.warning("cannot renew the lease of job %s: %s", plan.job_id, exc)

    outcome = engine_thread().run_shard(plan, shard, on_progress=on_progress, should_stop=should_stop,
                                         worker=worker)
    meter.finish(outcome, retrying=will_be_retried(outcome.state, outcome.transient, will_retry))
    return outcome


@app.task(name="tokenmill.process_shard", bind=True, max_retries=MAX_TRANSIENT_RETRIES)
def process_shard(self, plan_dict: dict[str, Any], shard_dict: dict[str, Any]) -> dict[str, Any]:
    """Process one shard (what the broker delivers): run it, retry transient storage failures
    (then report them as failed), and return its outcome as the task's result dict."""
    plan, shard = JobPlan.from_dict(plan_dict), ShardRef.from_dict(shard_dict)
    will_retry = self.request.retries < MAX_TRANSIENT_RETRIES
    store = _store()
    try:
        outcome = run_shard(plan, shard, store, _worker_name(), will_retry)
    except ShardHandedBack as exc:  # the worker is shutting down: the broker gives it to another now
        log.warning("%s; requeued", exc)
        if store is not None:
            with contextlib.suppress(Exception):
                store.set_shard(plan.job_id, shard.index, ShardOutcome.queued_state_dict(
                    shard.url, part=shard.part_id, reason=str(exc)))
        raise Reject(str(exc), requeue=True) from None
    outcome.part = outcome.part or shard.part_id
    if will_be_retried(outcome.state, outcome.transient, will_retry):
        log.warning("shard %d failed transiently, retrying: %s", shard.index, outcome.reason)
        raise self.retry(countdown=min(60, 5 * 2**self.request.retries))
    return outcome.to_result_dict()


def _finish_job(
    plan: JobPlan, outcomes: list[ShardOutcome], status: str | None = None, error: str | None = None
) -> dict[str, Any]:
    """Build and publish the manifest; ``status`` overrides it (the job failed: outcomes may be
    partial, so no stale part is removed)."""
    store = _store()
    meta = store.meta(plan.job_id) if store is not None else {}
    submitted = meta.get("submitted_at") or time.time()
    manifest = build_manifest(
        plan, outcomes, mode="celery",
        started_at=meta.get("submitted_at_iso") or utc_now(),
        elapsed_s=time.time() - submitted,
        summary=run_summary(plan, outcomes) if status is None else None,
    )
    if status is not None:
        manifest["status"], manifest["success_marker"], manifest["error"] = status, False, error
    else:
        report = run_report(plan, manifest)
        if report:
            manifest["report"] = report
    try:
        publish(plan, manifest, outcomes, prune=status is None)
    except OutputLeased as exc:  # another run holds the output: its manifest is not ours to write
        log.error("job %s writes no manifest: %s", plan.job_id, exc)
        manifest["status"], manifest["success_marker"], manifest["error"] = "failed", False, str(exc)
    else:
        release_output(plan)
    if store is not None:
        store.set_meta(plan.job_id, status=manifest["status"], finished_at=time.time(),
                       **({"error": manifest["error"]} if manifest.get("error") else {}))
    return manifest


@app.task(name="tokenmill.finalize_job", bind=True, max_retries=FINALIZE_MAX_RETRIES)
def finalize_job(
    self, results: list[dict[str, Any]], plan_dict: dict[str, Any], shard_indices: list[int] | None = None,
    shard_parts: list[str] | None = None,
) -> dict[str, Any]:
    """Chord callback: write the manifest, and _SUCCESS if no shard failed or was cancelled.

    A shard delivered twice (its worker died after storing the result, or it outran the
    visibility timeout) is counted twice by the chord, which can then fire before another
    shard has finished. So the callback checks that every shard it was given at submit time
    has a result; a missing one is taken from the state its worker reported once that is
    final (``retrying`` is not), and until then the callback retries rather than write a
    manifest without it. ``shard_parts`` (aligned with ``shard_indices``) name each shard's
    part, so parts of inputs that are gone can be removed.
    """
    plan = JobPlan.from_dict(plan_dict)
    store = _store()
    if store is not None and store.meta(plan.job_id).get(UNSTARTED_META):  # ended by its cancel
        log.warning("job %s was cancelled before any shard started: nothing to publish", plan.job_id)
        return {"job_id": plan.job_id, "status": "cancelled", "totals": {}}
    parts = dict(zip(shard_indices or (), shard_parts or (), strict=False))
    by_index = {  # one per shard, even if redelivered
        r["index"]: ShardOutcome.from_result_dict(r) for r in results if isinstance(r, dict)
    }
    for i, o in by_index.items():
        o.part = o.part or parts.get(i)
    missing = [i for i in shard_indices or () if i not in by_index]
    if missing:
        states = store.shards(plan.job_id) if store is not None else {}
        for i in missing:
            if ShardOutcome.is_final_state(states.get(i, {})):
                by_index[i] = ShardOutcome.from_state_dict(i, states[i], part=parts.get(i))
        still = [i for i in missing if i not in by_index]
        if still and self.request.retries < FINALIZE_MAX_RETRIES:
            log.warning("job %s: shards %s not finished yet; finalize waits", plan.job_id, still)
            raise self.retry(countdown=FINALIZE_RETRY_S)
        for i in still:  # a message lost for good (e.g. a broker restarted without persistence)
            waited = FINALIZE_MAX_RETRIES * FINALIZE_RETRY_S / 3600
            by_index[i] = ShardOutcome.from_state_dict(
                i, states.get(i, {}), f"no result after waiting {waited:.0f} h", part=parts.get(i)
            )
    manifest = _finish_job(plan, [by_index[i] for i in sorted(by_index)])
    return {"job_id": plan.job_id, "status": manifest["status"], "totals": manifest["totals"]}


@app.task(name="tokenmill.job_failed")
def job_failed(request: Any, exc: BaseException, traceback: Any, plan_dict: dict[str, Any] | None = None) -> None:
    """Errback of the chord: a shard task raised (a bug, not a bad shard). Writes a ``failed``
    manifest from the shard states workers reported, so the output says what happened."""
    if plan_dict is None:
        return
    plan = JobPlan.from_dict(plan_dict)
    log.error("job %s failed: %s", plan.job_id, exc)
    store = _store()
    states = store.shards(plan.job_id) if store is not None else {}
    outcomes = [ShardOutcome.from_state_dict(i, s, f"job failed: {exc}") for i, s in states.items()]
    _finish_job(plan, outcomes, status="failed", error=f"{type(exc).__name__}: {exc}")
