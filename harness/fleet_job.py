"""One harness call's requests as a tokenmill job of kind ``harness_requests``, and its results.

The job's folder is named by a digest of what decides its results: the request type, the
distinct requests (their token ids and settings, in job order), the model, its dtype and
context, and the shard size. The same evaluation run again therefore finds the same
folder: request files whose text is unchanged are not rewritten (their fingerprints hold),
so every part already committed is skipped and only the missing shards run. A run killed
halfway resumes where its parts stop.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from connectors import OutputLeased, join_url, read_manifest, read_parts, remove_optional, write_file_set
from engine.model_registry import PACKAGED_MODELS
from jobs import api
from jobs.spec import JobSpec
from pipeline.job_status import FINAL_JOB_STATUSES
from pipeline.shard_outcome import entry_part_file

log = logging.getLogger("lm_eval.models.tokenmill")
REQUEST_FILES = "requests-*.jsonl"
# Engine settings that change a result (the rest change only how fast it comes).
RESULT_ENGINE_FIELDS = ("model", "dtype", "max_model_len")


@dataclass
class FleetSettings:
    """Where jobs go: ``work_dir`` holds each job's request files and results; without a
    ``broker`` the job runs in this process (``jobs.api.run``), resumable all the same."""

    work_dir: str
    broker: str | None = None
    queue: str | None = None
    result_backend: str | None = None
    shard_rows: int = 256
    timeout_s: float | None = None
    poll_s: float = 1.0


@dataclass
class JobRun:
    """What one harness call ran: its job and the job's manifest (shards done and skipped)."""

    what: str
    requests: int
    unique: int
    job_id: str
    output_url: str
    manifest: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        totals = self.manifest.get("totals", {})
        ran = [s for s in self.manifest.get("shards", []) if s.get("status") == "done"]
        return (f"tokenmill {self.what}: {self.requests} requests ({self.unique} distinct) as job {self.job_id}: "
                f"{totals.get('shards_done', 0)} shards run, {totals.get('shards_skipped', 0)} taken as committed "
                f"from {self.output_url}; prefix cache hits {sum(s.get('cached_prompt_tokens') or 0 for s in ran)} "
                f"of {sum(s.get('prompt_tokens') or 0 for s in ran)} prompt tokens run")


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def _model_section(engine: dict[str, Any]) -> dict[str, Any]:
    section = {k: v for k, v in engine.items() if k != "model"}
    model = str(engine["model"])
    return {"name": model, **section} if model in PACKAGED_MODELS else {"path": model, **section}


def job_spec(what: str, rows: list[dict[str, Any]], engine: dict[str, Any], settings: FleetSettings,
             ) -> tuple[JobSpec, list[tuple[str, str]]]:
    """The job for ``rows`` (distinct, in job order, each with its ``id``) and its request files."""
    digest = _digest({"what": what, "rows": rows, "shard_rows": settings.shard_rows,
                      "engine": {k: engine.get(k) for k in RESULT_ENGINE_FIELDS}})
    folder = join_url(settings.work_dir, f"{what}-{digest}")
    requests_url = join_url(folder, "requests")
    files = []
    for n, first in enumerate(range(0, len(rows), settings.shard_rows)):
        text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows[first:first + settings.shard_rows])
        files.append((join_url(requests_url, f"requests-{n:05d}.jsonl"), text))
    spec = JobSpec.from_dict({
        "name": f"harness-{what}-{digest[:8]}".replace("_", "-"), "kind": "harness_requests",
        "input": {"url": requests_url, "glob": REQUEST_FILES, "format": "jsonl", "id_field": "id"},
        # the harness reads each request's error itself: no error budget (pipeline.error_budget)
        "output": {"url": join_url(folder, "results"), "max_error_fraction": 1.0},
        "model": _model_section(engine),
    })
    return spec, files


def run_job(spec: JobSpec, files: list[tuple[str, str]], settings: FleetSettings, rows: int = 0,
            progress: bool = False) -> tuple[str, dict[str, Any]]:
    """Write the request files (unchanged ones stay as they are), run the job, wait for it
    (a bar over its ``rows`` if ``progress``); returns (job id, manifest). Raises
    ``RuntimeError`` unless every shard succeeded."""
    write_file_set(spec.input.url, REQUEST_FILES, files)
    job_id = f"{spec.name}-{uuid.uuid4().hex[:8]}"
    if settings.broker is None:
        manifest = api.run(spec, job_id=job_id, progress=progress)
        status = manifest.get("status")
    else:
        try:
            api.submit(spec, settings.broker, job_id=job_id, queue=settings.queue,
                       result_backend=settings.result_backend)
            log.info("tokenmill: job %s queued, %d request files (tokenmill status %s)", job_id, len(files), job_id)
        except OutputLeased as exc:
            job_id = _running_job(exc, spec)  # an earlier run of this evaluation, still going: wait for it
        status = _wait(job_id, settings, rows, progress)
        manifest = read_manifest(spec.output.url) or {}
    if status != "succeeded":
        failed = [f"{s.get('url')}: {s.get('reason')}" for s in manifest.get("shards", []) if s.get("reason")]
        raise RuntimeError(f"tokenmill job {job_id} ended {status}: " + ("; ".join(failed[:3]) or "no reason given"))
    return job_id, manifest


def _wait(job_id: str, settings: FleetSettings, rows: int, progress: bool) -> str:
    """Poll the job until it ends, its rows done as a progress bar; its final status.
    ``TimeoutError`` after ``settings.timeout_s`` (None: as long as it takes)."""
    from tqdm import tqdm

    deadline = None if settings.timeout_s is None else time.monotonic() + settings.timeout_s
    with tqdm(total=rows, desc=f"job {job_id}", unit="request", disable=not progress) as bar:
        while True:
            status = api.status(job_id)
            bar.update(min(rows, status["progress"]["rows_done"]) - bar.n)
            if status["status"] in FINAL_JOB_STATUSES:
                return str(status["status"])
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {status['status']} after {settings.timeout_s}s")
            time.sleep(settings.poll_s)


def _running_job(exc: OutputLeased, spec: JobSpec) -> str:
    """The job id holding the output, if it is a live fleet job of this evaluation; else re-raise."""
    held = exc.lease.run_id if exc.lease is not None else ""
    if not held.startswith(f"{spec.name}-"):
        raise exc
    try:
        api.status(held)
    except KeyError:
        raise exc from None
    log.info("tokenmill: job %s of this evaluation still holds %s; waiting for it", held, spec.output.url)
    return held


def read_results(spec: JobSpec, manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each request's result row by id; ``RuntimeError`` names the first row with an error.

    A part holding an error row is removed first: committed, it would be taken as current by
    every later run of this evaluation, which could then never succeed; removed, the next run
    computes that shard again."""
    table = read_parts(spec.output.url, parts=manifest.get("parts"))
    rows = {r["id"]: r for r in table.to_pylist()}
    bad = next((r for r in rows.values() if r.get("error")), None)
    if bad is not None:
        options = spec.output_storage_options()
        for entry in manifest.get("shards", []):
            part_file = entry_part_file(entry)
            if entry.get("errors") and part_file:
                remove_optional(join_url(spec.output.url, part_file), options)
        raise RuntimeError(f"tokenmill could not run request {bad['id']}: {bad['error']} "
                           "(its shard runs again when this evaluation is run again)")
    return rows
