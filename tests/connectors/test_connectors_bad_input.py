"""connectors: every kind of bad input row or shard, with its exact message.

Readable shards must give rows in == rows out, bad rows flagged; unreadable
shards raise ShardReadError naming the URL.
"""

from __future__ import annotations

import gzip
import io
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from s3_server import S3Server, free_port

from connectors import Record, ShardReadError, ShardRef, StorageError, list_shards, read_records

# --- helpers ---------------------------------------------------------------------


@pytest.fixture
def mem() -> Iterator[str]:
    """A fresh memory:// prefix."""
    root = f"/bad-{uuid.uuid4().hex[:10]}"
    yield f"memory://{root}"
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


def put(url: str, data: bytes) -> str:
    fs, path = fsspec.core.url_to_fs(url)
    fs.pipe(path, data)
    return url


def read(url: str, **kwargs: Any) -> list[Record]:
    kwargs.setdefault("text_field", "text")
    storage_options = kwargs.pop("storage_options", None)
    (shard,) = list_shards(url, storage_options=storage_options)
    return [r for b in read_records(shard, storage_options=storage_options, **kwargs) for r in b]


def parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


# --- JSONL rows ------------------------------------------------------------------

BAD_JSONL_LINES: list[tuple[bytes, str | None]] = [
    (b'{"id": "a", "text": "fine"}', None),
    (
        b'{"id": "b", "text": "unterminated',
        "row 1: malformed JSON: Unterminated string starting at: line 1 column 21 (char 20)",
    ),
    (b'["not", "an", "object"]', "row 2: expected a JSON object, got array"),
    (b'"just a string"', "row 3: expected a JSON object, got string"),
    (b'{"id": "e", "text": "caf\xe9"}', "row 4: invalid UTF-8"),
    (b'{"id": "f", "body": "no text here"}', "row 5: missing text field 'text'"),
    (b'{"id": "g", "text": 42}', "row 6: text field 'text' is number, expected a string"),
    (b'{"id": "h", "text": null}', "row 7: text field 'text' is null, expected a string"),
    (b'{"id": "i", "text": ["a"]}', "row 8: text field 'text' is array, expected a string"),
    (b'{"id": "j", "text": ""}', "row 9: empty document"),
    (b'{"id": "k", "text": " \\n\\t "}', "row 10: empty document"),
    (b'{"id": "l", "text": "' + b"x" * 101 + b'"}', "row 11: document is 101 bytes, over the 100-byte limit"),
    (
        b'{"id": "m", "text": "' + "é".encode() * 51 + b'"}',
        "row 12: document is 102 bytes, over the 100-byte limit",
    ),
    (b"[" * 100_000 + b"]" * 100_000, "row 13: malformed JSON: nesting too deep"),
    (
        b'{"id": "o", "text": "ok", "deep": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "row 14: malformed JSON: nesting too deep",
    ),
    (b'{"id": "p", "text": "lone \\ud800 surrogate"}', "row 15: invalid UTF-8"),
    (b'{"text": "no id"}', "row 16: missing id field 'id'"),
    (b'{"id": 17, "text": "numeric id"}', None),
]


@pytest.mark.parametrize("compression", [None, "gz", "zst"])
def test_jsonl_bad_rows_are_flagged_with_exact_messages(mem: str, compression: str | None) -> None:
    data = b"\n".join(line for line, _ in BAD_JSONL_LINES) + b"\n\n  \n"  # blank trailing lines
    name = "bad.jsonl"
    if compression == "gz":
        data, name = gzip.compress(data), name + ".gz"
    elif compression == "zst":
        data, name = zstandard.ZstdCompressor().compress(data), name + ".zst"
    records = read(put(f"{mem}/{name}", data), id_field="id", max_text_bytes=100, batch_size=4)

    assert len(records) == len(BAD_JSONL_LINES)  # rows in == rows out, blank trailing lines are not rows
    assert [r.error for r in records] == [expected for _, expected in BAD_JSONL_LINES]
    assert [r.row_number for r in records] == list(range(len(records)))
    assert records[0].id == "a" and records[0].fields == {"id": "a", "text": "fine"}
    assert records[1].id == f"{name}:1"  # unparseable: id falls back to basename:row
    assert records[6].id == "g"  # parsed rows keep their id even when flagged
    assert records[16].id == f"{name}:16"
    assert records[17].id == "17" and records[17].error is None


def test_jsonl_without_id_field_uses_basename_and_row(mem: str) -> None:
    records = read(put(f"{mem}/x.jsonl", b'{"text": "a"}\n{"text": "b"}'))  # no final newline
    assert [(r.id, r.error) for r in records] == [("x.jsonl:0", None), ("x.jsonl:1", None)]


def test_jsonl_blank_lines_and_bom(mem: str) -> None:
    data = b'\xef\xbb\xbf{"text": "a"}\r\n\r\n{"text": "b"}\n\n'
    records = read(put(f"{mem}/x.jsonl", data))
    assert [(r.row_number, r.fields["text"], r.error) for r in records] == [(0, "a", None), (1, "b", None)]


def test_jsonl_oversized_line_is_drained_not_held(mem: str) -> None:
    # limit for max_text_bytes=10 is 4*10 + 1 MiB; this line is over it
    huge = b'{"text": "' + b"y" * ((1 << 20) + 100) + b'"}'
    data = b'{"text": "before"}\n' + huge + b'\n{"text": "after"}\n'
    records = read(put(f"{mem}/x.jsonl", data), max_text_bytes=10)
    assert [r.error for r in records] == [
        None,
        f"row 1: line is {len(huge) + 1} bytes, over the {40 + (1 << 20)}-byte line limit",
        None,
    ]
    assert records[2].fields == {"text": "after"}


def test_empty_jsonl_shard_yields_nothing(mem: str) -> None:
    assert read(put(f"{mem}/x.jsonl", b"")) == []


@pytest.mark.parametrize(
    ("name", "compress"),
    [("x.jsonl.gz", gzip.compress), ("x.jsonl.zst", zstandard.ZstdCompressor().compress)],
)
def test_corrupt_or_truncated_compression_is_a_shard_error(mem: str, name: str, compress: Any) -> None:
    kind = "gzip" if name.endswith(".gz") else "zstd"
    url = put(f"{mem}/{name}", b"this is not compressed data")
    with pytest.raises(
        ShardReadError, match=rf"cannot read shard memory://.*/{name}: corrupt or truncated {kind}"
    ):
        read(url)
    whole = compress(b'{"text": "a"}\n' * 1000) + compress(b'{"text": "b"}\n' * 1000)
    assert len(read(put(f"{mem}/{name}", whole))) == 2000  # concatenated members/frames
    for cut in (20, len(whole) // 2 + 5):  # a cut-off upload must not read as a shorter shard
        url = put(f"{mem}/{name}", whole[:-cut])
        with pytest.raises(ShardReadError, match=f"corrupt or truncated {kind}"):
            read(url)


# --- CSV -------------------------------------------------------------------------


def test_csv_bad_rows(mem: str) -> None:
    data = (
        b"id,text,extra\n"
        b"1,hello,x\n"
        b"2,only two\n"
        b"3,too,many,columns\n"
        b"4,,x\n"
        b'5,"quoted, with comma\nand newline",x\n'
        b"6,caf\xe9,x\n"
        b",no id,x\n"
        b"\n"
    )
    records = read(put(f"{mem}/x.csv", data), id_field="id")
    assert [r.error for r in records] == [
        None,
        "row 1: expected 3 columns, got 2",
        "row 2: expected 3 columns, got 4",
        "row 3: empty document",
        None,
        "row 5: invalid UTF-8",
        "row 6: missing id field 'id'",
    ]
    assert records[1].fields == {"id": "2", "text": "only two"} and records[1].id == "2"
    assert records[4].fields["text"] == "quoted, with comma\nand newline"
    assert records[6].id == "x.csv:6"


def test_csv_header_without_text_column(mem: str) -> None:
    url = put(f"{mem}/x.csv", b"id,body\n1,hello\n")
    with pytest.raises(
        ShardReadError, match=r"x\.csv: CSV header has no column 'text' \(columns: id, body\)"
    ):
        read(url)


def test_empty_csv_is_a_shard_error(mem: str) -> None:
    with pytest.raises(ShardReadError, match="empty CSV"):
        read(put(f"{mem}/x.csv", b""))


def test_csv_large_field_beyond_default_csv_limit(mem: str) -> None:
    text = "z" * 200_000  # over the csv module's default 128 KiB field limit
    records = read(put(f"{mem}/x.csv", f"text\n{text}\n".encode()))
    assert records[0].error is None and records[0].fields["text"] == text


# --- Parquet ---------------------------------------------------------------------


def test_parquet_without_text_column(mem: str) -> None:
    url = put(f"{mem}/x.parquet", parquet_bytes(pa.table({"id": [1], "body": ["b"]})))
    with pytest.raises(
        ShardReadError, match=r"x\.parquet: parquet schema has no column 'text' \(columns: id, body\)"
    ):
        read(url)


def test_parquet_bad_values(mem: str) -> None:
    table = pa.table({"id": ["a", None, "c", "d"], "text": ["ok", "also ok", None, "  "]})
    records = read(put(f"{mem}/x.parquet", parquet_bytes(table)), id_field="id")
    assert [r.error for r in records] == [
        None,
        "row 1: missing id field 'id'",
        "row 2: text field 'text' is null, expected a string",
        "row 3: empty document",
    ]
    table = pa.table({"text": pa.array([1, 2], pa.int64())})
    records = read(put(f"{mem}/n.parquet", parquet_bytes(table)))
    assert [r.error for r in records] == [
        "row 0: text field 'text' is number, expected a string",
        "row 1: text field 'text' is number, expected a string",
    ]


def test_parquet_invalid_utf8_is_a_row_error(mem: str) -> None:
    """Arrow does not validate strings on write or read; the bad row is flagged, the rest read."""
    texts = pa.array([b"fine", b"caf\xe9 latin-1", b"also fine"], type=pa.binary()).cast(pa.string(), safe=False)
    table = pa.table({"id": ["a", "b", "c"], "text": texts})
    records = read(put(f"{mem}/x.parquet", parquet_bytes(table)), id_field="id")
    assert [(r.id, r.error) for r in records] == [("a", None), ("x.parquet:1", "row 1: invalid UTF-8"), ("c", None)]
    assert records[2].fields["text"] == "also fine"


def test_corrupt_parquet_is_a_shard_error(mem: str) -> None:
    url = put(f"{mem}/x.parquet", b"PAR1 definitely not parquet")
    with pytest.raises(ShardReadError, match=r"cannot read shard memory://.*/x\.parquet: unreadable parquet"):
        read(url)


# --- missing and denied shards ---------------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv"])
def test_missing_shard_local_and_memory(tmp_path: Any, mem: str, fmt: str) -> None:
    for url in (f"file://{tmp_path}/gone.{fmt}", f"{mem}/gone.{fmt}"):
        shard = ShardRef(0, url, fmt, None)
        with pytest.raises(ShardReadError, match=f"cannot read shard {url}: no such file"):
            read_records(shard, text_field="text")


def test_missing_shard_s3(s3_server: S3Server, s3_bucket: str) -> None:
    opts = s3_server.storage_options
    put_s3 = fsspec.filesystem("s3", skip_instance_cache=True, **opts)
    put_s3.pipe(f"{s3_bucket}/in/a.jsonl", b'{"text": "a"}\n')
    (shard,) = list_shards(f"s3://{s3_bucket}/in/a.jsonl", storage_options=opts)
    put_s3.rm(f"{s3_bucket}/in/a.jsonl")
    with pytest.raises(ShardReadError, match=f"cannot read shard s3://{s3_bucket}/in/a.jsonl: no such file"):
        read_records(shard, text_field="text", storage_options=opts)
    missing_bucket = ShardRef(0, "s3://no-such-bucket-tm/a.jsonl", "jsonl", None)
    with pytest.raises(ShardReadError, match="s3://no-such-bucket-tm/a.jsonl: no such file"):
        read_records(missing_bucket, text_field="text", storage_options=opts)


class _DenyAll(BaseHTTPRequestHandler):
    """Answers every S3 request with 403 AccessDenied, as a bucket policy denial would."""

    _BODY = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
        b"<Message>Access Denied</Message><RequestId>tm</RequestId></Error>"
    )

    def _deny(self, body: bool = True) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(self._BODY) if body else 0))
        self.end_headers()
        if body:
            self.wfile.write(self._BODY)

    def do_HEAD(self) -> None:  # noqa: N802 - http.server naming
        self._deny(body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._deny()

    do_PUT = do_POST = do_DELETE = do_GET

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def deny_all_s3() -> Iterator[dict[str, Any]]:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _DenyAll)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {
                "endpoint_url": f"http://127.0.0.1:{server.server_address[1]}",
                "region_name": "us-east-1",
            },
        }
    finally:
        server.shutdown()
        server.server_close()


def test_access_denied_is_a_shard_error(deny_all_s3: dict[str, Any]) -> None:
    # Access denial is exercised for real over HTTP: s3fs receives a genuine 403
    # AccessDenied response from a stub endpoint, translates it to PermissionError,
    # and the reader must turn that into ShardReadError without retrying.
    # (chmod cannot deny root, and moto does not enforce credentials by default.)
    shard = ShardRef(0, "s3://locked-bucket/docs/a.jsonl", "jsonl", None)
    with pytest.raises(
        ShardReadError, match=r"cannot read shard s3://locked-bucket/docs/a\.jsonl: access denied"
    ):
        read_records(shard, text_field="text", storage_options=deny_all_s3)
    with pytest.raises(StorageError, match="access denied listing s3://locked-bucket/docs"):
        list_shards("s3://locked-bucket/docs/", storage_options=deny_all_s3)
