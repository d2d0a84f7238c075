"""``/v1/batches``: create, retrieve, cancel, list (``after``/``limit``), in OpenAI's shapes."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from connectors.blobs import read_bytes
from service.auth import Owner, owned
from service.batch_input import KNOWN_ENDPOINTS, SUPPORTED_ENDPOINTS, check_for_batch
from service.errors import bad_request
from service.pagination import page
from service.records import BATCH_FINAL, BatchRecord, FileRecord, new_id, now

router = APIRouter(prefix="/v1/batches")


class CreateBatch(BaseModel):
    input_file_id: str
    endpoint: str
    completion_window: str
    # OpenAI's bounds: 16 pairs, keys up to 64 characters, values up to 512
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = Field(
        None, max_length=16)



@router.post("")
def create_batch(request: Request, owner: Owner, body: CreateBatch) -> dict[str, Any]:
    store, settings = request.app.state.store, request.app.state.settings
    if body.endpoint not in KNOWN_ENDPOINTS:
        raise bad_request(f"unknown endpoint {body.endpoint!r}; this server serves "
                          f"{', '.join(SUPPORTED_ENDPOINTS)}", "endpoint", "invalid_value")
    if body.endpoint not in SUPPORTED_ENDPOINTS:
        raise bad_request(f"endpoint {body.endpoint!r} is not served here; use {' or '.join(SUPPORTED_ENDPOINTS)}",
                          "endpoint", "unsupported_value")
    if body.completion_window != "24h":
        raise bad_request("completion_window must be '24h'", "completion_window", "invalid_value")
    source = owned(request, FileRecord, "file", body.input_file_id, owner)
    if source.purpose != "batch":
        raise bad_request(f"file {source.id} has purpose {source.purpose!r}, not 'batch'", "input_file_id")
    total = check_for_batch(read_bytes(source.content_url, settings.storage_options), body.endpoint,
                            settings.model_name)
    batch_id = new_id("batch_")
    created = now()
    record = BatchRecord(
        id=batch_id, owner=owner, created_at=created, input_file_id=source.id, endpoint=body.endpoint,
        completion_window=body.completion_window, model=settings.model_name, metadata=body.metadata,
        output_url=store.batch_output_url(batch_id), expires_at=created + 24 * 3600,
        request_counts={"total": total, "completed": 0, "failed": 0},
    )
    with store.lock:
        store.put(record)
    return record.public()


@router.get("")
def list_batches(request: Request, owner: Owner, after: str | None = None,
                 limit: Annotated[int, Query(ge=1, le=100)] = 20) -> dict[str, Any]:
    records = request.app.state.store.all(BatchRecord, owner)
    return page([r.public() for r in records], after, limit)


@router.get("/{batch_id}")
def retrieve_batch(request: Request, owner: Owner, batch_id: str) -> dict[str, Any]:
    return owned(request, BatchRecord, "batch", batch_id, owner).public()


@router.post("/{batch_id}/cancel")
def cancel_batch(request: Request, owner: Owner, batch_id: str) -> dict[str, Any]:
    store = request.app.state.store
    with store.lock:
        record = owned(request, BatchRecord, "batch", batch_id, owner)
        if record.status in BATCH_FINAL or record.status == "cancelling":
            if record.status in ("completed", "failed", "expired"):
                raise bad_request(f"Cannot cancel a batch with status {record.status!r}.", "batch_id",
                                  "invalid_state")
            return record.public()
        record.status, record.cancelling_at = "cancelling", now()
        store.put(record)
    if record.job_id is not None:
        try:
            request.app.state.runner.cancel(record.job_id)
        except KeyError:
            pass  # the job's state is lost: the batch advancer fails the batch as job_lost
    return record.public()
