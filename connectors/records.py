"""Streaming record reader for one shard, with per-row validation.

Bad rows are kept and flagged (`Record.error`) so rows in == rows out and the
output can say exactly which input rows were skipped and why. Only problems that
make the whole shard unreadable raise `ShardReadError`; transient storage errors
propagate unchanged so the caller can retry the shard.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import IO, Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from connectors.compression import CORRUPT_DATA_ERRORS, READ_BUFFER, open_decompressed
from connectors.shards import ShardRef
from connectors.storage import StorageError, filesystem_for, is_transient, with_retries

_BOM = b"\xef\xbb\xbf"


@dataclass
class Record:
    """One input row; `error` set means the row is bad and `fields` may be partial or empty."""

    id: str
    row_number: int
    fields: dict[str, Any]
    error: str | None = None


class ShardReadError(StorageError):
    """The whole shard cannot be read (missing, denied, corrupt, lacking the text column)."""


# A line this long cannot hold a document under the limit, even with JSON escaping;
# it is drained and flagged instead of being held in memory.
def _line_limit(max_text_bytes: int) -> int:
    return 4 * max_text_bytes + (1 << 20)


_JSON_TYPE_NAMES: dict[type, str] = {
    dict: "object",
    list: "array",
    str: "string",
    bool: "boolean",
    int: "number",
    float: "number",
    type(None): "null",
}


def _type_name(value: Any) -> str:
    """JSON names for JSON types (the user's vocabulary), Python names otherwise (e.g. bytes)."""
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def _encodes_as_utf8(text: str) -> bool:
    """False for strings holding lone surrogates (undecodable bytes or bad \\u escapes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# Rows from a format reader: (fields, error-or-None) before text/id validation.
_Row = tuple[dict[str, Any], str | None]


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
            return f"text field '{self.text_field}' is {_type_name(text)}, expected a string"
        if not text or text.isspace():
            return "empty document"
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            return "invalid UTF-8"
        if size > self.max_text_bytes:
            return f"document is {size} bytes, over the {self.max_text_bytes}-byte limit"
        return None


# --- opening -------------------------------------------------------------------


def _fail(shard: ShardRef, reason: str) -> ShardReadError:
    return ShardReadError(f"cannot read shard {shard.url}: {reason}", shard.url)


@contextmanager
def _shard_errors(shard: ShardRef) -> Iterator[None]:
    """Turn permanent read failures into ShardReadError; let transient ones through for a retry."""
    try:
        yield
    except ShardReadError:
        raise
    except FileNotFoundError as exc:
        raise _fail(shard, "no such file") from exc
    except PermissionError as exc:
        raise _fail(shard, f"access denied ({exc})") from exc
    except CORRUPT_DATA_ERRORS as exc:
        raise _fail(shard, f"corrupt or truncated {shard.compression or 'compressed'} data ({exc})") from exc
    except csv.Error as exc:
        raise _fail(shard, f"malformed CSV ({exc})") from exc
    except pa.ArrowException as exc:
        raise _fail(shard, f"unreadable {shard.format} data ({exc})") from exc
    except OSError as exc:
        if is_transient(exc):
            raise
        raise _fail(shard, f"{type(exc).__name__}: {exc}") from exc


def _open_raw(fs: fsspec.AbstractFileSystem, path: str, shard: ShardRef) -> IO[bytes]:
    return with_retries(lambda: fs.open(path, "rb"), what=f"open {shard.url}")


def _open_stream(fs: fsspec.AbstractFileSystem, path: str, shard: ShardRef, stack: ExitStack) -> IO[bytes]:
    """A buffered, decompressed byte stream; everything opened is registered on `stack`."""
    raw = stack.enter_context(_open_raw(fs, path, shard))
    try:
        stream = open_decompressed(raw, shard.compression)
    except ValueError as exc:
        raise _fail(shard, str(exc)) from exc
    return stack.enter_context(stream)


def _jsonl_rows(stream: IO[bytes], line_limit: int) -> Iterator[_Row]:
    first = True
    while line := stream.readline(line_limit + 1):
        if len(line) > line_limit and not line.endswith(b"\n"):
            size = len(line)
            while chunk := stream.readline(READ_BUFFER):  # drain without holding it
                size += len(chunk)
                if chunk.endswith(b"\n"):
                    break
            yield {}, f"line is {size} bytes, over the {line_limit}-byte line limit"
            continue
        if first:
            line = line.removeprefix(_BOM)
            first = False
        if line.isspace() or not line:
            continue  # blank lines (including a trailing one) are not rows
        line = line.rstrip(b"\r\n")
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            yield {}, "invalid UTF-8"
            continue
        try:
            value = json.loads(text)
        except RecursionError:
            yield {}, "malformed JSON: nesting too deep"
            continue
        except ValueError as exc:  # JSONDecodeError, and int-digit limits
            yield {}, f"malformed JSON: {exc}"
            continue
        if not isinstance(value, dict):
            yield {}, f"expected a JSON object, got {_type_name(value)}"
            continue
        if b"\\u" in line and not _encodes_as_utf8(json.dumps(value, ensure_ascii=False)):
            yield {}, "invalid UTF-8"  # a lone-surrogate escape such as "\ud800"
            continue
        yield value, None


def _open_jsonl(
    fs: fsspec.AbstractFileSystem,
    path: str,
    shard: ShardRef,
    text_field: str,
    max_text_bytes: int,
    batch_size: int,
) -> tuple[Iterator[_Row], int]:
    stack = ExitStack()
    try:
        stream = _open_stream(fs, path, shard, stack)
    except BaseException:
        stack.close()
        raise

    def rows() -> Iterator[_Row]:
        with stack:
            yield from _jsonl_rows(stream, _line_limit(max_text_bytes))

    return rows(), 0


def _open_csv(
    fs: fsspec.AbstractFileSystem,
    path: str,
    shard: ShardRef,
    text_field: str,
    max_text_bytes: int,
    batch_size: int,
) -> tuple[Iterator[_Row], int]:
    # The csv module keeps one row in memory and handles quoted newlines; its
    # field limit doubles as the oversized-row guard.
    csv.field_size_limit(max(csv.field_size_limit(), _line_limit(max_text_bytes)))
    stack = ExitStack()
    try:
        stream = _open_stream(fs, path, shard, stack)
        # surrogateescape: undecodable bytes become flaggable per row instead of failing the shard.
        text = stack.enter_context(
            io.TextIOWrapper(stream, encoding="utf-8-sig", errors="surrogateescape", newline="")
        )
        reader = csv.reader(text)
        header = next((row for row in reader if row), None)
        if header is None:
            raise _fail(shard, "empty CSV file (no header row)")
        if text_field not in header:
            raise _fail(shard, f"CSV header has no column '{text_field}' (columns: {', '.join(header)})")
    except BaseException:
        stack.close()
        raise

    def next_row() -> list[str] | str | None:
        """The next CSV row, its error for a field over the limit (the row is skipped,
        the reader goes on at the next line), or None at the end."""
        try:
            return next(reader)
        except StopIteration:
            return None
        except csv.Error as exc:
            if "field larger than field limit" not in str(exc):
                raise
            return f"a field is over the {csv.field_size_limit()}-byte CSV field limit"

    def rows() -> Iterator[_Row]:
        with stack:
            while (row := next_row()) is not None:
                if isinstance(row, str):
                    yield {}, row
                    continue
                if not row:
                    continue  # blank line
                if not all(_encodes_as_utf8(value) for value in row):
                    yield {}, "invalid UTF-8"
                elif len(row) != len(header):
                    yield (
                        dict(zip(header, row, strict=False)),
                        f"expected {len(header)} columns, got {len(row)}",
                    )
                else:
                    yield dict(zip(header, row, strict=True)), None

    return rows(), 0


def _open_parquet(
    fs: fsspec.AbstractFileSystem,
    path: str,
    shard: ShardRef,
    text_field: str,
    max_text_bytes: int,
    batch_size: int,
) -> tuple[Iterator[_Row], int]:
    stack = ExitStack()
    try:
        raw = stack.enter_context(_open_raw(fs, path, shard))
        # buffer_size: stream pages instead of loading whole column chunks.
        pf = pq.ParquetFile(raw, buffer_size=READ_BUFFER)
        columns = pf.schema_arrow.names
        if text_field not in columns:
            raise _fail(shard, f"parquet schema has no column '{text_field}' (columns: {', '.join(columns)})")
        start, row_groups = 0, None
        if shard.row_group is not None:
            if not 0 <= shard.row_group < pf.num_row_groups:
                raise _fail(
                    shard, f"row group {shard.row_group} does not exist ({pf.num_row_groups} row groups)"
                )
            start = sum(pf.metadata.row_group(i).num_rows for i in range(shard.row_group))
            row_groups = [shard.row_group]
    except BaseException:
        stack.close()
        raise

    def rows() -> Iterator[_Row]:
        with stack:
            for batch in pf.iter_batches(batch_size=batch_size, row_groups=row_groups):
                try:
                    decoded = batch.to_pylist()
                except UnicodeDecodeError:  # a string value that is not UTF-8: find the row
                    yield from _rows_one_by_one(batch)
                    continue
                for row in decoded:
                    yield row, None

    return rows(), start


def _rows_one_by_one(batch: pa.RecordBatch) -> Iterator[_Row]:
    for i in range(batch.num_rows):
        try:
            (row,) = batch.slice(i, 1).to_pylist()
        except UnicodeDecodeError:
            yield {}, "invalid UTF-8"
            continue
        yield row, None


_OPENERS = {"jsonl": _open_jsonl, "csv": _open_csv, "parquet": _open_parquet}


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
    opener = _OPENERS.get(shard.format)
    if opener is None:
        raise _fail(shard, f"unknown format {shard.format!r}")
    fs, path = filesystem_for(shard.url, storage_options)
    with _shard_errors(shard):
        rows, start = opener(fs, path, shard, text_field, max_text_bytes, batch_size)
    validator = _Validator(shard.basename, text_field, id_field, max_text_bytes)
    return _batches(shard, rows, start, validator, batch_size)


def _batches(
    shard: ShardRef, rows: Iterator[_Row], start: int, validator: _Validator, batch_size: int
) -> Iterator[list[Record]]:
    try:
        with _shard_errors(shard):
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
