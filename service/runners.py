"""Where the server's jobs run: the Celery fleet (a broker was given) or a thread of the server.

Both answer ``submit(plan)``, ``status(job_id)`` (the dict of ``tokenmill status``) and
``cancel(job_id)``. The fleet keeps job state in Redis, so it survives a server restart;
the embedded runner keeps it in memory, and a job it was running when the server stopped
is reported failed (``KeyError`` from ``status``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from connectors import list_shards
from pipeline import metrics
from pipeline.engine_share import EngineShare
from pipeline.job_runner import run_embedded
from pipeline.plan import JobPlan
from pipeline.shard_outcome import ShardOutcome

log = logging.getLogger(__name__)


class Runner(Protocol):
    def submit(self, plan: JobPlan) -> str: ...

    def status(self, job_id: str) -> dict[str, Any]: ...

    def cancel(self, job_id: str) -> None: ...


class FleetRunner:
    def __init__(self, broker_url: str, queue_name: str | None, redis_key_prefix: str | None) -> None:
        self.broker_url, self.queue, self.prefix = broker_url, queue_name, redis_key_prefix

    def submit(self, plan: JobPlan) -> str:
        from pipeline.fleet import submit_job  # lazy: an embedded server never loads the Celery app

        return submit_job(plan, self.broker_url, queue=self.queue, redis_key_prefix=self.prefix)

    def status(self, job_id: str) -> dict[str, Any]:
        from pipeline.fleet import job_status  # lazy: an embedded server never loads the Celery app

        return job_status(job_id)

    def cancel(self, job_id: str) -> None:
        from pipeline.fleet import cancel_job  # lazy: an embedded server never loads the Celery app

        cancel_job(job_id)


@dataclass
class _EmbeddedJob:
    plan: JobPlan
    meta: dict[str, Any]
    shards: dict[int, dict[str, Any]] = field(default_factory=dict)
    cancel: threading.Event = field(default_factory=threading.Event)


class EmbeddedRunner:
    """Jobs one after another on a thread of this process, through ``run_embedded``. The state of
    the ``keep_finished`` most recently finished jobs is kept; older ones are forgotten (their
    records keep the final status), so a long-lived server's memory grows with open jobs only.

    A job whose engine settings are those of ``engines`` (the live routes' engine, in ``tokenmill
    serve``) runs on that engine, behind the live requests; one with other settings (another
    model, another ``max_num_seqs``...) gets the process's cached engine, a second one, as before."""

    def __init__(self, keep_finished: int = 100, engines: EngineShare | None = None) -> None:
        self.keep_finished, self.engines = keep_finished, engines
        self._jobs: dict[str, _EmbeddedJob] = {}
        self._queue: queue.Queue[str] = queue.Queue()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="tokenmill-embedded-runner", daemon=True)
        self._thread.start()

    def submit(self, plan: JobPlan) -> str:
        shards = list_shards(plan.input_url, format=plan.input_format, storage_options=plan.storage_options,
                             split_row_groups=plan.split_row_groups)
        job = _EmbeddedJob(plan, {"name": plan.name, "kind": plan.kind, "status": "queued",
                                  "submitted_at": time.time(), "output_url": plan.output_url})
        job.shards = {s.index: ShardOutcome.queued_state_dict(s.url) for s in shards}
        with self._lock:
            self._jobs[plan.job_id] = job
        self._queue.put(plan.job_id)
        return plan.job_id

    def status(self, job_id: str) -> dict[str, Any]:
        from pipeline.fleet import live_status  # lazy: an embedded server never loads the Celery app

        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise KeyError(f"unknown job {job_id!r} (the embedded runner keeps no state across restarts)")
            return live_status(job_id, dict(job.meta), {i: dict(s) for i, s in job.shards.items()})

    def cancel(self, job_id: str) -> None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise KeyError(f"unknown job {job_id!r}")
            job.cancel.set()
            job.meta["cancel_requested_at"] = time.time()

    def _serve(self) -> None:
        while True:
            job = self._jobs[self._queue.get()]
            try:
                self._run(job)
            except Exception as exc:  # the runner thread must survive any job
                log.exception("embedded job %s failed", job.plan.job_id)
                with self._lock:
                    job.meta.update(status="failed", error=f"{type(exc).__name__}: {exc}", finished_at=time.time())
            self._forget_old()

    def _forget_old(self) -> None:
        with self._lock:
            finished = sorted((j.meta["finished_at"], job_id) for job_id, j in self._jobs.items()
                              if j.meta.get("finished_at") is not None)
            for _, job_id in finished[: max(0, len(finished) - self.keep_finished)]:
                del self._jobs[job_id]

    def _run(self, job: _EmbeddedJob) -> None:
        def on_progress(p: ShardOutcome) -> None:
            state = {**p.to_state_dict(), "started_at": p.started_at, "updated_at": time.time(), "worker": "embedded",
                     **{k: v for k, v in metrics.snapshot().items() if k in ("kv_usage", "prefix_hit_rate")}}
            with self._lock:
                job.shards[p.index] = state

        if job.cancel.is_set():
            with self._lock:
                job.meta.update(status="cancelled", finished_at=time.time())
                for s in job.shards.values():
                    s.update(state="cancelled", reason="job cancelled")
            return
        shares = self.engines is not None and self.engines.matches(job.plan.engine_settings)
        view = self.engines.view(f"job {job.plan.job_id}") if shares else None
        try:
            manifest = run_embedded(job.plan, progress=False, should_stop=job.cancel.is_set, on_progress=on_progress,
                                    engine=view, engine_factory=None if view is None else (lambda: view))
        finally:
            if view is not None:
                self.engines.leave(view)
        with self._lock:
            job.meta.update(status=manifest["status"], finished_at=time.time(),
                            **({"error": manifest["error"]} if manifest.get("error") else {}))
