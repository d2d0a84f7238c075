"""``/v1/files``: upload (multipart, ``purpose=batch``), list, retrieve, content, delete."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import Response

from connectors import write_bytes
from connectors.blobs import delete_object, read_bytes
from service.auth import Owner, owned
from service.batch_input import check_upload
from service.errors import APIError, bad_request
from service.pagination import page
from service.records import FileRecord, new_id

router = APIRouter(prefix="/v1/files")
PURPOSES = ("batch",)
CHUNK = 1 << 20



def _read_limited(upload: UploadFile, limit: int) -> bytes:
    chunks, size = [], 0
    while chunk := upload.file.read(CHUNK):
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"File is too large: the limit is {limit} bytes.", param="file",
                           code="file_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


@router.post("")
def create_file(request: Request, owner: Owner, file: Annotated[UploadFile, File()],
                purpose: Annotated[str, Form()]) -> dict[str, Any]:
    """A plain ``def``: FastAPI runs it on a worker thread, so reading, checking (JSON of up to
    200 MB) and storing the upload never holds the event loop (``/healthz`` keeps answering)."""
    if purpose not in PURPOSES:
        raise bad_request(f"purpose {purpose!r} is not supported here; use 'batch'", "purpose", "invalid_value")
    settings = request.app.state.settings
    data = _read_limited(file, settings.max_upload_bytes)  # the part itself, whatever the headers say
    check_upload(data, settings.max_batch_lines)
    store = request.app.state.store
    file_id = new_id("file-")
    url = store.content_url(file_id)
    write_bytes(url, data, settings.storage_options)
    record = FileRecord(id=file_id, owner=owner, filename=file.filename or "upload.jsonl", purpose=purpose,
                        bytes=len(data), content_url=url)
    store.put(record)
    return record.public()


@router.get("")
def list_files(request: Request, owner: Owner, after: str | None = None,
               limit: Annotated[int, Query(ge=1, le=10000)] = 10000, purpose: str | None = None,
               order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc") -> dict[str, Any]:
    records = [r for r in request.app.state.store.all(FileRecord, owner) if purpose in (None, r.purpose)]
    return page([r.public() for r in records], after, limit, order)


@router.get("/{file_id}")
def retrieve_file(request: Request, owner: Owner, file_id: str) -> dict[str, Any]:
    return owned(request, FileRecord, "file", file_id, owner).public()


@router.get("/{file_id}/content")
def file_content(request: Request, owner: Owner, file_id: str) -> Response:
    record = owned(request, FileRecord, "file", file_id, owner)
    data = read_bytes(record.content_url, request.app.state.settings.storage_options)
    return Response(data, media_type="application/jsonl")


@router.delete("/{file_id}")
def delete_file(request: Request, owner: Owner, file_id: str) -> dict[str, Any]:
    record = owned(request, FileRecord, "file", file_id, owner)
    store = request.app.state.store
    delete_object(record.content_url, request.app.state.settings.storage_options)
    store.delete(record)
    return {"id": file_id, "object": "file", "deleted": True}
