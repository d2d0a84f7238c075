"""tokenmill's own jobs: ``POST /v1/jobs`` (a spec as JSON), list, status (``tokenmill status``), cancel."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from pydantic import ValidationError

from connectors import StorageError
from jobs.spec import JobSpec
from jobs.spec_errors import format_errors
from service.auth import Owner, owned
from service.errors import APIError, bad_request
from service.records import JobRecord

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
    request.app.state.spec_policy.check(parsed)  # before anything opens storage or resolves a credential
    try:
        plan = parsed.to_plan()
        job_id = request.app.state.runner.submit(plan)
    except StorageError as exc:
        raise bad_request(f"input error: {exc}", "input.url", "input_error") from None
    except ValueError as exc:
        raise bad_request(str(exc), None, "invalid_spec") from None
    record = JobRecord(id=job_id, owner=owner, kind=plan.kind, name=plan.name, output_url=plan.output_url)
    request.app.state.store.put(record)
    return record.public()


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
        raise APIError(410, f"job {job_id}: {exc.args[0] if exc.args else 'state lost'}", code="job_lost") from None
    return {**record.public(), **status, "id": job_id}


@router.post("/{job_id}/cancel")
def cancel_job(request: Request, owner: Owner, job_id: str) -> dict[str, Any]:
    record = owned(request, JobRecord, "job", job_id, owner)
    runner = request.app.state.runner
    runner.cancel(job_id)
    return {**record.public(), **runner.status(job_id), "id": job_id}
