"""A batch's life: validating -> in_progress -> finalizing -> completed (or failed; cancelling -> cancelled).

A background thread of the server (``BatchAdvancer``) moves every unfinished batch along:
it turns a validating batch into an ``openai_batch`` job and submits it, follows the job's
shards into ``request_counts``, and when the job ends splits its output lines into the
batch's output file (answered requests) and error file (failed ones, keyed by custom_id).
The same loop keeps the status of plain jobs fresh for the listings and metrics.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from typing import Any

from connectors import is_transient, read_manifest, write_bytes
from connectors.blobs import read_bytes
from jobs.openai_merge import merge_lines
from jobs.spec import JobSpec
from pipeline.job_status import FINAL_JOB_STATUSES as JOB_FINAL
from pipeline.shard_outcome import entry_has_part, entry_part_id
from service.records import BATCH_FINAL, BatchRecord, FileRecord, JobRecord, Store, now
from service.runners import Runner
from service.settings import ServiceSettings

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 60.0


def is_outage(exc: BaseException) -> bool:
    """A storage or broker error that a later try may not hit (network, timeout, 5xx, a Redis
    restart): the batch waits and tries again, it does not fail."""
    if is_transient(exc):
        return True
    try:
        import redis

        if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                            redis.exceptions.BusyLoadingError)):
            return True
    except ImportError:  # pragma: no cover - redis comes with the fleet extras
        pass
    from kombu.exceptions import OperationalError

    return isinstance(exc, OperationalError)


def batch_spec(batch: BatchRecord, store: Store, settings: ServiceSettings) -> JobSpec:
    return JobSpec.from_dict({
        "name": "openai-batch", "kind": "openai_batch",
        "input": {"url": store.content_url(batch.input_file_id), "format": "openai_batch"},
        "output": {"url": batch.output_url},
        "model": settings.model_section(),
        "sampling": {"max_tokens": settings.default_max_tokens, "temperature": 0.0},
    })


class BatchAdvancer:
    def __init__(self, store: Store, runner: Runner, settings: ServiceSettings) -> None:
        self.store, self.runner, self.settings = store, runner, settings
        self._stop = threading.Event()
        self._retry: dict[str, tuple[int, float]] = {}  # batch id -> (outages in a row, next try at)
        self._thread = threading.Thread(target=self._loop, name="tokenmill-batch-advancer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.settings.poll_s):
            try:
                self.tick()
            except Exception:
                log.exception("batch advancer tick failed")

    def tick(self) -> None:
        """One pass over the open batches and jobs. An outage (``is_outage``) while a batch
        advances leaves it as it is and retries it with backoff; only another error fails it."""
        for batch in self.store.open(BatchRecord):
            if self._retry.get(batch.id, (0, 0.0))[1] > time.monotonic():
                continue
            try:
                self.advance(batch.id)
                self._retry.pop(batch.id, None)
            except Exception as exc:
                if is_outage(exc):
                    self._back_off(batch.id, exc)
                    continue
                log.exception("batch %s", batch.id)
                self._update(batch.id, status="failed", failed_at=now(),
                             errors=[{"code": "server_error", "message": f"{type(exc).__name__}: {exc}"}])
        for job in self.store.open(JobRecord):
            if job.status not in JOB_FINAL:
                try:
                    self._refresh_job(job)
                except Exception as exc:
                    if not is_outage(exc):
                        raise
                    log.warning("job %s: status not refreshed (%s: %s)", job.id, type(exc).__name__, exc)

    def _back_off(self, batch_id: str, exc: BaseException) -> None:
        outages = self._retry.get(batch_id, (0, 0.0))[0] + 1
        delay = min(MAX_BACKOFF_S, self.settings.poll_s * 2 ** outages)
        self._retry[batch_id] = (outages, time.monotonic() + delay)
        log.warning("batch %s: %s: %s (outage %d in a row, next try in %.1f s)", batch_id, type(exc).__name__,
                    exc, outages, delay)

    def _refresh_job(self, job: JobRecord) -> None:
        try:
            status = self.runner.status(job.id)["status"]
        except KeyError:
            status = "failed"  # an embedded job lost with a server restart
        if status != job.status:
            with self.store.lock:
                job.status = status
                self.store.put(job)

    def _update(self, batch_id: str, **values: Any) -> BatchRecord:
        with self.store.lock:
            batch = self.store.get(BatchRecord, batch_id)
            for key, value in values.items():
                setattr(batch, key, value)
            self.store.put(batch)
            return batch

    def advance(self, batch_id: str) -> None:
        batch = self.store.get(BatchRecord, batch_id)
        if batch is None or batch.status in BATCH_FINAL:
            return
        if batch.job_id is None:
            if batch.status == "cancelling":
                self._update(batch_id, status="cancelled", cancelled_at=now())
                return
            self._submit(batch)
            return
        try:
            job = self.runner.status(batch.job_id)
        except KeyError as exc:
            self._update(batch_id, status="failed", failed_at=now(),
                         errors=[{"code": "job_lost", "message": str(exc.args[0] if exc.args else exc)}])
            return
        progress = job["progress"]
        counts = {"total": batch.request_counts["total"],
                  "completed": progress["rows_done"] - progress["errors"], "failed": progress["errors"]}
        if job["status"] not in JOB_FINAL:
            values: dict[str, Any] = {"request_counts": counts}
            if job["status"] == "finalizing" and batch.status == "in_progress":
                values.update(status="finalizing", finalizing_at=now())
            self._update(batch_id, **values)
            return
        if job["status"] == "failed":
            reasons = [s["reason"] for s in job["shards"] if s.get("reason")] or ["the job failed"]
            self._update(batch_id, status="failed", failed_at=now(), request_counts=counts,
                         errors=[{"code": "job_failed", "message": r} for r in reasons[:10]])
            return
        if batch.status == "in_progress":
            batch = self._update(batch_id, status="finalizing", finalizing_at=now())
        # the job's record is final before the batch is: readers that see the batch done see both
        self._refresh_job(self.store.get(JobRecord, batch.job_id) or JobRecord(
            id=batch.job_id, owner=batch.owner, kind="openai_batch", name="openai-batch", batch_id=batch.id))
        self._finalize(batch, cancelled=job["status"] == "cancelled")

    def _submit(self, batch: BatchRecord) -> None:
        """Submit the batch's job (its id is the batch's), unless a run of this loop that
        crashed before recording it already did: then the live job is adopted, never
        resubmitted over its own state."""
        if self._runner_knows(batch.id):
            job_id = batch.id
        else:
            try:
                plan = batch_spec(batch, self.store, self.settings).to_plan(batch.id)
            except ValueError as exc:  # the request file no longer converts (validated at create)
                self._update(batch.id, status="failed", failed_at=now(),
                             errors=[{"code": "invalid_request", "message": str(exc)}])
                return
            job_id = self.runner.submit(plan)
        with self.store.lock:  # a cancel may have come in while the job was being submitted
            if self.store.get(JobRecord, job_id) is None:
                self.store.put(JobRecord(id=job_id, owner=batch.owner, kind="openai_batch", name="openai-batch",
                                         status="queued", batch_id=batch.id, output_url=batch.output_url))
            cancelled = self.store.get(BatchRecord, batch.id).status == "cancelling"
            if cancelled:
                self._update(batch.id, job_id=job_id)
            else:
                self._update(batch.id, job_id=job_id, status="in_progress", in_progress_at=now())
        if cancelled:
            self.runner.cancel(job_id)

    def _runner_knows(self, job_id: str) -> bool:
        try:
            self.runner.status(job_id)
        except KeyError:
            return False
        return True

    def _finalize(self, batch: BatchRecord, *, cancelled: bool) -> None:
        """Split the job's output lines into the output file and the error file."""
        merged = merge_lines(batch.output_url, self._parts(batch), self.settings.storage_options)
        ok, failed = [], []
        for line in read_bytes(merged["url"], self.settings.storage_options).splitlines():
            if line.strip():
                (failed if json.loads(line).get("error") is not None else ok).append(line + b"\n")
        values: dict[str, Any] = {
            "request_counts": {"total": batch.request_counts["total"], "completed": len(ok), "failed": len(failed)},
            "output_file_id": self._result_file(batch, "output", ok) if ok else None,
            "error_file_id": self._result_file(batch, "error", failed) if failed else None,
        }
        if cancelled:
            values.update(status="cancelled", cancelled_at=now())
        else:
            values.update(status="completed", completed_at=now())
        self._update(batch.id, **values)

    def _parts(self, batch: BatchRecord) -> list[str]:
        """The part ids of the job's done and skipped shards, from its manifest (a cancelled job's
        manifest lists the shards finished before the cancel; its summary hook did not run)."""
        manifest = read_manifest(batch.output_url, self.settings.storage_options) or {}
        return [entry_part_id(s) for s in manifest.get("shards", []) if entry_has_part(s)]

    def _result_file(self, batch: BatchRecord, which: str, lines: list[bytes]) -> str:
        """The batch's output or error file. Its id follows from the batch's, so a finalize
        repeated after a crash rewrites the same record instead of adding a second one."""
        file_id = "file-" + hashlib.sha256(f"{batch.id}:{which}".encode()).hexdigest()[:24]
        data = b"".join(lines)
        url = self.store.content_url(file_id)
        write_bytes(url, data, self.settings.storage_options)
        self.store.put(FileRecord(id=file_id, owner=batch.owner, filename=f"{batch.id}_{which}.jsonl",
                                  purpose="batch_output", bytes=len(data), content_url=url))
        return file_id
