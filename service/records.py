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
from collections import Counter
from typing import Any, TypeVar

from pydantic import BaseModel, Field

from connectors import join_url
from connectors.blobs import delete_object, read_json, read_json_folder, write_json
from pipeline.job_status import FINAL_JOB_STATUSES

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


_TRACKED = (BatchRecord, JobRecord)  # the kinds whose open records the loop and /metrics follow


def is_open(record: Record) -> bool:
    if isinstance(record, BatchRecord):
        return record.status not in BATCH_FINAL
    return isinstance(record, JobRecord) and record.status not in FINAL_JOB_STATUSES


class Store:
    """Records by id, and every record of a type (listing reads the folder: fine for thousands).

    The status of every batch and job is also kept in memory, read once on first use and
    updated by ``put``/``delete``: the batch loop and ``/metrics`` then cost the open records,
    not all records ever made. This server is the only writer of its storage (one server
    per storage location), so the memory stays true.
    """

    def __init__(self, base_url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.options = storage_options or {}
        self.lock = threading.RLock()  # read-modify-write of a record inside this server
        self._status: dict[type[Record], dict[str, str]] | None = None
        self._open: dict[type[Record], dict[str, Record]] = {cls: {} for cls in _TRACKED}

    def _index(self) -> dict[type[Record], dict[str, str]]:
        with self.lock:
            if self._status is None:
                status: dict[type[Record], dict[str, str]] = {}
                for cls in _TRACKED:
                    records = self.all(cls)
                    status[cls] = {r.id: r.status for r in records}
                    self._open[cls] = {r.id: r for r in records if is_open(r)}
                self._status = status
            return self._status

    def _observe(self, record: Record, deleted: bool = False) -> None:
        cls = type(record)
        if cls not in _TRACKED or self._status is None:
            return
        with self.lock:
            if deleted:
                self._status[cls].pop(record.id, None)
            else:
                self._status[cls][record.id] = record.status
            if is_open(record) and not deleted:
                self._open[cls][record.id] = record.model_copy()
            else:
                self._open[cls].pop(record.id, None)

    def open(self, cls: type[R]) -> list[R]:
        """The unfinished records of a type, from memory (copies, oldest first)."""
        self._index()
        with self.lock:
            records = [r.model_copy() for r in self._open[cls].values()]
        return sorted(records, key=lambda r: (r.created_at, r.id))  # type: ignore[return-value]

    def status_counts(self, cls: type[Record]) -> Counter[str]:
        """How many records of a type are in each status, from memory."""
        index = self._index()
        with self.lock:
            return Counter(index[cls].values())

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
        self._observe(record)

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
        self._observe(record, deleted=True)
