"""Raw rows of one shard, one reader per format (JSONL, CSV, Parquet), streamed.

Each reader opens the shard and checks what makes the whole shard unreadable (no header,
no text column, a missing row group) before it returns; after that a bad row is yielded
with its error instead of raising, so the caller can keep it (rows in == rows out).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from contextlib import ExitStack
from typing import IO, Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from connectors.compression import READ_BUFFER, open_decompressed
from connectors.shard_errors import unreadable
from connectors.shards import ShardRef
from connectors.storage import with_retries

_BOM = b"\xef\xbb\xbf"


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


def json_type_name(value: Any) -> str:
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
Row = tuple[dict[str, Any], str | None]


def _open_raw(fs: fsspec.AbstractFileSystem, path: str, shard: ShardRef) -> IO[bytes]:
    return with_retries(lambda: fs.open(path, "rb"), what=f"open {shard.url}")


def _open_stream(fs: fsspec.AbstractFileSystem, path: str, shard: ShardRef, stack: ExitStack) -> IO[bytes]:
    """A buffered, decompressed byte stream; everything opened is registered on `stack`."""
    raw = stack.enter_context(_open_raw(fs, path, shard))
    try:
        stream = open_decompressed(raw, shard.compression)
    except ValueError as exc:
        raise unreadable(shard, str(exc)) from exc
    return stack.enter_context(stream)


def _jsonl_rows(stream: IO[bytes], line_limit: int) -> Iterator[Row]:
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
            yield {}, f"expected a JSON object, got {json_type_name(value)}"
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
) -> tuple[Iterator[Row], int]:
    stack = ExitStack()
    try:
        stream = _open_stream(fs, path, shard, stack)
    except BaseException:
        stack.close()
        raise

    def rows() -> Iterator[Row]:
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
) -> tuple[Iterator[Row], int]:
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
            raise unreadable(shard, "empty CSV file (no header row)")
        if text_field not in header:
            raise unreadable(shard, f"CSV header has no column '{text_field}' (columns: {', '.join(header)})")
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

    def rows() -> Iterator[Row]:
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
) -> tuple[Iterator[Row], int]:
    stack = ExitStack()
    try:
        raw = stack.enter_context(_open_raw(fs, path, shard))
        # buffer_size: stream pages instead of loading whole column chunks.
        pf = pq.ParquetFile(raw, buffer_size=READ_BUFFER)
        columns = pf.schema_arrow.names
        if text_field not in columns:
            raise unreadable(shard, f"parquet schema has no column '{text_field}' (columns: {', '.join(columns)})")
        start, row_groups = 0, None
        if shard.row_group is not None:
            if not 0 <= shard.row_group < pf.num_row_groups:
                raise unreadable(
                    shard, f"row group {shard.row_group} does not exist ({pf.num_row_groups} row groups)"
                )
            start = sum(pf.metadata.row_group(i).num_rows for i in range(shard.row_group))
            row_groups = [shard.row_group]
    except BaseException:
        stack.close()
        raise

    def rows() -> Iterator[Row]:
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


def _rows_one_by_one(batch: pa.RecordBatch) -> Iterator[Row]:
    for i in range(batch.num_rows):
        try:
            (row,) = batch.slice(i, 1).to_pylist()
        except UnicodeDecodeError:
            yield {}, "invalid UTF-8"
            continue
        yield row, None


ROW_OPENERS = {"jsonl": _open_jsonl, "csv": _open_csv, "parquet": _open_parquet}
