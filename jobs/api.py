"""The Python submission API: the same operations as the CLI, for notebooks and orchestrators.

    from jobs import JobSpec, run, submit, status, wait
    job_id = submit("jobs/nightly.toml")          # to the fleet (Redis/RabbitMQ)
    final = wait(job_id, timeout=3600)
    manifest = run("examples/demo/summarize.toml")  # embedded, in this process

``pipeline`` is imported inside each function: loading a spec should not pull in torch
or Celery, and a broker URL given on the command line must be set before Celery reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobs.spec import JobSpec


def load(spec: JobSpec | str | Path) -> JobSpec:
    """A JobSpec from a spec object or a TOML/YAML file path."""
    return spec if isinstance(spec, JobSpec) else JobSpec.from_file(spec)


def submit(
    spec: JobSpec | str | Path,
    broker_url: str | None = None,
    *,
    job_id: str | None = None,
    queue: str | None = None,
    result_backend: str | None = None,
    redis_key_prefix: str | None = None,
) -> str:
    """Queue the job on the fleet (one task per shard); returns its job id at once."""
    from pipeline.fleet import submit_job  # lazy: the Celery app reads $TOKENMILL_BROKER_URL once, on import

    plan = load(spec).to_plan(job_id)
    return submit_job(plan, broker_url, result_backend=result_backend, queue=queue,
                      redis_key_prefix=redis_key_prefix)


def status(job_id: str) -> dict[str, Any]:
    """Live state of a fleet job: overall status, per-shard state and progress (from Redis)."""
    from pipeline.fleet import job_status  # lazy: as in submit

    return job_status(job_id)


def output_status(spec: JobSpec | str | Path) -> dict[str, Any]:
    """State of a spec's job read from its output (manifest or parts): works for embedded runs too.
    Writes nothing (the plan is built read-only)."""
    from pipeline.fleet import job_status  # lazy: as in submit

    return job_status(load(spec).to_plan("status", read_only=True))


def wait(job_id: str, timeout: float | None = None, poll: float = 1.0) -> dict[str, Any]:
    """Poll until the job is succeeded/completed_with_errors/cancelled/failed; returns its status.
    Raises TimeoutError after ``timeout`` seconds (None: wait as long as it takes)."""
    from pipeline.fleet import wait_for_job  # lazy: as in submit

    return wait_for_job(job_id, timeout, poll_s=poll)


def cancel(job_id: str, *, release: bool = False) -> dict[str, Any]:
    """Ask the fleet to stop the job; running shards stop within about a second. A job that never
    started ends at once and its output's lease is released; ``release`` releases it anyway."""
    from pipeline.fleet import cancel_job  # lazy: as in submit

    return cancel_job(job_id, release=release)


def run(spec: JobSpec | str | Path, *, progress: bool = False, job_id: str | None = None) -> dict[str, Any]:
    """Run the whole job in this process (no broker) and return its manifest. SIGTERM or SIGINT
    checkpoints it and raises ``RunInterrupted`` (a ``SystemExit``, code 143 or 130)."""
    from pipeline.job_runner import run_embedded  # lazy: the engine imports torch (seconds)

    return run_embedded(load(spec).to_plan(job_id), progress=progress)
