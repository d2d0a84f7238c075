"""Streaming record reader for one shard, with per-row validation.

Bad rows are kept and flagged (`Record.error`) so rows in == rows out and the
output can say exactly which input rows were skipped and why. Only problems that
make the whole shard unreadable raise `ShardReadError`; transient storage errors
propagate unchanged so the caller can retry the shard.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from connectors.shard_errors import ShardReadError, shard_errors, unreadable
from connectors.shard_rows import ROW_OPENERS, Row, json_type_name
from connectors.shards import ShardRef
from connectors.storage import filesystem_for

__all__ = ["Record", "ShardReadError", "read_records"]


@dataclass
class Record:
    """One input row; `error` set means the row is bad and `fields` may be partial or empty."""

    id: str
    row_number: int
    fields: dict[str, Any]
    error: str | None = None


@dataclass
class _Validator:
    basename: str
    text_field: str
    id_field: str | None
    max_text_bytes: int

    def record(self, n: int, fields: dict[str, Any], error: str | None) -> Record:
        if error is None:
            error = self._text_error(fields)
        record_id = None
        if self.id_field is not None:
            value = fields.get(self.id_field)
            if value is None or value == "":
                if error is None:
                    error = f"missing id field '{self.id_field}'"
            else:
                record_id = str(value)
        return Record(
            id=record_id if record_id is not None else f"{self.basename}:{n}",
            row_number=n,
            fields=fields,
            error=f"row {n}: {error}" if error else None,
        )

    def _text_error(self, fields: dict[str, Any]) -> str | None:
        if self.text_field not in fields:
            return f"missing text field '{self.text_field}'"
        text = fields[self.text_field]
        if not isinstance(text, str):
            return f"text field '{self.text_field}' is {json_type_name(text)}, expected a string"
        if not text or text.isspace():
            return "empty document"
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            return "invalid UTF-8"
        if size > self.max_text_bytes:
            return f"document is {size} bytes, over the {self.max_text_bytes}-byte limit"
        return None


def read_records(
    shard: ShardRef,
    *,
    text_field: str,
    id_field: str | None = None,
    batch_size: int = 1024,
    storage_options: dict | None = None,
    max_text_bytes: int = 8_000_000,
) -> Iterator[list[Record]]:
    """Batches of at most `batch_size` records, streamed; memory does not grow with shard size.

    The shard is opened and its header/schema checked before this returns, so a
    missing, denied or column-less shard raises ShardReadError immediately.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    opener = ROW_OPENERS.get(shard.format)
    if opener is None:
        raise unreadable(shard, f"unknown format {shard.format!r}")
    fs, path = filesystem_for(shard.url, storage_options)
    with shard_errors(shard):
        rows, start = opener(fs, path, shard, text_field, max_text_bytes, batch_size)
    validator = _Validator(shard.basename, text_field, id_field, max_text_bytes)
    return _batches(shard, rows, start, validator, batch_size)


def _batches(
    shard: ShardRef, rows: Iterator[Row], start: int, validator: _Validator, batch_size: int
) -> Iterator[list[Record]]:
    try:
        with shard_errors(shard):
            batch: list[Record] = []
            for n, (fields, error) in enumerate(rows, start):
                batch.append(validator.record(n, fields, error))
                if len(batch) >= batch_size:
                    yield batch
                    batch = []
            if batch:
                yield batch
    finally:
        close = getattr(rows, "close", None)
        if close is not None:
            close()
