"""Scheduled jobs: Celery beat fires each spec's ``schedule``; a worker enqueues the job.

``tokenmill beat --jobs DIR`` reads every spec in DIR that has a ``schedule`` and builds a
beat entry per spec (``crontab`` for cron expressions, a plain interval for ``every
30s``). Each fire sends ``tokenmill.enqueue_scheduled_job`` carrying the spec itself (paths
already absolute), so the worker that runs it needs no access to the spec files. That
worker lists the shards and submits the job exactly like ``tokenmill submit``. Every run
gets a fresh job id (``<name>-<UTC time>-<random>``) but writes to the same output, so parts
whose input did not change are skipped: a nightly job over a growing prefix only
processes new files.

Workers must import this module to know the task: ``tokenmill worker`` does.
Beat holds the schedule in memory (no ``celerybeat-schedule`` file); restart it after
editing a spec.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from connectors import CredentialError, literal_credentials
from jobs.api import submit
from jobs.secrets import reveal
from jobs.spec import JobSpec
from pipeline.celery_app import app, make_app

log = logging.getLogger(__name__)

ENQUEUE_TASK = "tokenmill.enqueue_scheduled_job"
SPEC_SUFFIXES = (".toml", ".yaml", ".yml")


@app.task(name=ENQUEUE_TASK)
def enqueue_scheduled_job(spec_data: dict[str, Any], broker_url: str | None = None, queue: str | None = None) -> str:
    """Submit one run of a scheduled spec; returns the new job id."""
    spec = JobSpec.from_dict(spec_data)
    job_id = f"{spec.name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{spec.new_job_id()[-4:]}"
    submitted = submit(spec, broker_url, job_id=job_id, queue=queue)
    log.info("scheduled job %s submitted as %s", spec.name, submitted)
    return submitted


def spec_files(directory: str | Path) -> list[Path]:
    return sorted(p for p in Path(directory).iterdir() if p.is_file() and p.suffix.lower() in SPEC_SUFFIXES)


def load_scheduled(directory: str | Path) -> dict[Path, Any]:
    """{path: JobSpec} for every spec in ``directory`` that has a schedule. Any invalid spec raises:
    beat should not start with a job silently missing."""
    specs = {path: JobSpec.from_file(path) for path in spec_files(directory)}
    return {path: spec for path, spec in specs.items() if spec.schedule}


def beat_schedule(specs: dict[Path, Any], broker_url: str | None, queue: str) -> dict[str, dict[str, Any]]:
    """Celery ``beat_schedule`` entries, one per spec (names must be unique). Each fire carries
    the spec through the broker, so a spec holding a literal credential is refused."""
    entries: dict[str, dict[str, Any]] = {}
    for path, spec in specs.items():
        if spec.name in entries:
            raise ValueError(f"{path}: job name {spec.name!r} is used by another scheduled spec")
        found = literal_credentials(reveal(spec.input.storage_options), "input.storage_options")
        found += literal_credentials(reveal(spec.output.storage_options or {}), "output.storage_options")
        if found:
            raise CredentialError(f"{path}: {', '.join(found)}: a scheduled spec travels through the broker; "
                                  "give credentials as \"${env:NAME}\" references or a profile")
        entries[spec.name] = {
            "task": ENQUEUE_TASK,
            "schedule": spec.parsed_schedule.celery(),
            "args": (spec.to_data(), broker_url, queue),
            "options": {"queue": queue},
        }
    return entries


def run_beat(
    directory: str | Path, broker_url: str | None = None, loglevel: str = "INFO", specs: dict[Path, Any] | None = None
) -> None:
    """Serve the schedules of every spec in ``directory`` (or of ``specs``, already loaded)
    until stopped (blocks)."""
    specs = load_scheduled(directory) if specs is None else specs
    if not specs:
        raise ValueError(f"no spec with a schedule in {directory}")
    beat_app = make_app(broker_url)
    queue = beat_app.conf.task_default_queue
    beat_app.conf.beat_schedule = beat_schedule(specs, broker_url, queue)
    shortest = min(s.parsed_schedule.seconds or 60.0 for s in specs.values())
    beat_app.conf.beat_max_loop_interval = max(0.5, min(60.0, shortest / 2))
    for path, spec in specs.items():
        log.debug("scheduling %s (%s) from %s", spec.name, spec.schedule, path)
    beat_app.Beat(scheduler="celery.beat:Scheduler", loglevel=loglevel, quiet=True).run()
