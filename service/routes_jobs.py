"""tokenmill's own jobs: ``POST /v1/jobs`` (a spec as JSON), list, status (``tokenmill status``), cancel."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from pydantic import ValidationError

from connectors import StorageError
from jobs.spec import JobSpec
from jobs.spec_errors import format_errors
from pipeline.job_status import FINAL_JOB_STATUSES
from service.auth import Owner, owned
from service.errors import APIError, bad_request, not_found
from service.records import JobRecord, Store
from service.runners import Runner
from service.spec_policy import literal_prefix

router = APIRouter(prefix="/v1/jobs")


@router.post("")
def create_job(request: Request, owner: Owner, spec: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
    """Validated like ``tokenmill submit``: every spec problem is named (400)."""
    try:
        parsed = JobSpec.from_dict(spec)
    except ValidationError as exc:
        lines = format_errors(exc, JobSpec)
        raise bad_request("; ".join(lines), lines[0].split(":", 1)[0] if lines else None, "invalid_spec") from None
    if parsed.schedule:
        raise bad_request("schedule: scheduled specs run under 'tokenmill beat', not the API", "schedule")
    parsed = request.app.state.spec_policy.check(parsed, owner)  # normal URLs; before anything opens storage
    owners = request.app.state.output_owners  # a team's results are its own, after its run too
    owners.check_read(literal_prefix(parsed.input.full_url), owner, "input.url")
    if parsed.extract is not None and parsed.extract.schema_file:
        owners.check_read(parsed.extract.schema_file, owner, "extract.schema_file")
    owners.claim(parsed.output.url, owner)
    store, runner = request.app.state.store, request.app.state.runner
    try:
        plan = parsed.to_plan(_fresh_job_id(parsed, store, runner))
        job_id = runner.submit(plan)
    except StorageError as exc:
        raise bad_request(f"input error: {exc}", "input.url", "input_error") from None
    except ValueError as exc:
        raise bad_request(str(exc), None, "invalid_spec") from None
    record = JobRecord(id=job_id, owner=owner, kind=plan.kind, name=plan.name, output_url=plan.output_url)
    store.put(record)
    return record.public()


def _fresh_job_id(spec: JobSpec, store: Store, runner: Runner) -> str:
    """An id no record and no runner state holds: the name is any team's to choose and the
    random part short, so it is checked, not trusted, never to land on another job's state."""
    for _ in range(8):
        job_id = spec.new_job_id()
        if store.get(JobRecord, job_id) is None and not _runner_knows(runner, job_id):
            return job_id
    raise APIError(503, "could not choose a fresh job id; try again", code="job_id_unavailable")


def _runner_knows(runner: Runner, job_id: str) -> bool:
    try:
        runner.status(job_id)
    except KeyError:
        return False
    return True


@router.get("")
def list_jobs(request: Request, owner: Owner) -> dict[str, Any]:
    records = request.app.state.store.all(JobRecord, owner)
    return {"object": "list", "data": [r.public() for r in reversed(records)]}


@router.get("/{job_id}")
def job_status(request: Request, owner: Owner, job_id: str) -> dict[str, Any]:
    record = owned(request, JobRecord, "job", job_id, owner)
    try:
        status = request.app.state.runner.status(job_id)
    except KeyError as exc:
        if record.status in FINAL_JOB_STATUSES:  # finished and forgotten by the runner: the record speaks
            return {**record.public(), "shards": [], "progress": None}
        raise APIError(410, f"job {job_id}: {exc.args[0] if exc.args else 'state lost'}", code="job_lost") from None
    return {**record.public(), **status, "id": job_id}


@router.post("/{job_id}/cancel")
def cancel_job(request: Request, owner: Owner, job_id: str) -> dict[str, Any]:
    record = owned(request, JobRecord, "job", job_id, owner)
    runner = request.app.state.runner
    try:
        runner.cancel(job_id)
        status = runner.status(job_id)
    except KeyError:  # the record outlived the job's state (an embedded job before a restart)
        raise not_found("job", job_id) from None
    return {**record.public(), **status, "id": job_id}
