"""The service's metadata: one JSON object per file, batch and job in the configured storage.

Layout under the storage URL (everything survives a server restart)::

    files/meta/<file-id>.json     FileRecord        files/content/<file-id>.jsonl   the bytes
    batches/<batch-id>.json       BatchRecord       outputs/<batch-id>/             the batch job's output
    jobs/<job-id>.json            JobRecord

Records carry the owner's key hash, never the key. Reads go through ``connectors.blobs``.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, TypeVar

from pydantic import BaseModel, Field

from connectors import join_url
from connectors.blobs import delete_object, read_json, read_json_folder, write_json

R = TypeVar("R", bound="Record")

BATCH_FINAL = ("completed", "failed", "cancelled", "expired")


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


class Record(BaseModel):
    id: str
    owner: str
    created_at: int = Field(default_factory=now)


class FileRecord(Record):
    filename: str
    purpose: str
    bytes: int
    content_url: str
    status: str = "processed"

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": self.status,
                "expires_at": None, "status_details": None}


class BatchRecord(Record):
    input_file_id: str
    endpoint: str
    completion_window: str
    model: str
    metadata: dict[str, str] | None = None
    status: str = "validating"
    job_id: str | None = None
    output_url: str
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[dict[str, Any]] | None = None
    request_counts: dict[str, int] = Field(default_factory=lambda: {"total": 0, "completed": 0, "failed": 0})
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    expires_at: int | None = None

    def public(self) -> dict[str, Any]:
        data = self.model_dump(exclude={"owner", "job_id", "output_url", "errors"})
        data.update(object="batch", errors={"object": "list", "data": self.errors} if self.errors else None,
                    expired_at=None, tokenmill_job_id=self.job_id)
        return data


class JobRecord(Record):
    kind: str
    name: str
    status: str = "queued"
    batch_id: str | None = None
    output_url: str | None = None
    plan: dict[str, Any] | None = None  # kept for the embedded runner's restart check only

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "object": "tokenmill.job", "kind": self.kind, "name": self.name,
                "status": self.status, "created_at": self.created_at, "batch_id": self.batch_id,
                "output_url": self.output_url}


_FOLDERS = {FileRecord: "files/meta", BatchRecord: "batches", JobRecord: "jobs"}


class Store:
    """Records by id, and every record of a type (listing reads the folder: fine for thousands)."""

    def __init__(self, base_url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.options = storage_options or {}
        self.lock = threading.RLock()  # read-modify-write of a record inside this server

    def url(self, *names: str) -> str:
        url = self.base_url
        for name in names:
            url = join_url(url, name)
        return url

    def content_url(self, file_id: str) -> str:
        return self.url("files", "content", f"{file_id}.jsonl")

    def batch_output_url(self, batch_id: str) -> str:
        return self.url("outputs", batch_id) + "/"

    def put(self, record: Record) -> None:
        write_json(self.url(_FOLDERS[type(record)], f"{record.id}.json"), record.model_dump(), self.options)

    def get(self, cls: type[R], record_id: str, owner: str | None = None) -> R | None:
        """The record, or None if it does not exist or belongs to another owner."""
        if not record_id or "/" in record_id or record_id.startswith("."):
            return None
        data = read_json(self.url(_FOLDERS[cls], f"{record_id}.json"), self.options)
        record = cls.model_validate(data) if data is not None else None
        if record is None or (owner is not None and record.owner != owner):
            return None
        return record

    def all(self, cls: type[R], owner: str | None = None) -> list[R]:
        records = [cls.model_validate(d) for d in read_json_folder(self.url(_FOLDERS[cls]), self.options)]
        records = [r for r in records if owner is None or r.owner == owner]
        return sorted(records, key=lambda r: (r.created_at, r.id))

    def delete(self, record: Record) -> None:
        delete_object(self.url(_FOLDERS[type(record)], f"{record.id}.json"), self.options)
