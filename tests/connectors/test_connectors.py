"""connectors: listing, reading, atomic parquet parts, manifests and retries on file://, memory:// and s3://."""

from __future__ import annotations

import csv
import errno
import gzip
import io
import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

import connectors
from connectors import (
    PartWriter,
    ShardRef,
    StorageError,
    detect_format,
    filesystem_for,
    join_url,
    list_shards,
    part_is_current,
    part_name,
    part_url,
    read_manifest,
    read_part_footer,
    read_parts,
    read_records,
    success_marker_exists,
    with_retries,
    write_manifest,
    write_part,
    write_success_marker,
    write_text,
)
from connectors import atomic as atomic_mod

# --- helpers -------------------------------------------------------------------


@dataclass
class Store:
    """A fresh location on one backend, plus a filesystem for test setup that bypasses connectors."""

    base: str
    storage_options: dict[str, Any]
    fs: fsspec.AbstractFileSystem
    root: str  # fs path of `base`
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def url(self, name: str) -> str:
        return join_url(self.base, name)

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def put(self, name: str, data: bytes) -> str:
        self.fs.pipe(self.path(name), data)
        return self.url(name)

    def exists(self, name: str) -> bool:
        self.fs.invalidate_cache()
        return self.fs.exists(self.path(name))

    def find(self) -> list[str]:
        self.fs.invalidate_cache()
        return sorted(p[len(self.root) + 1 :] for p in self.fs.find(self.root))


def _make_store(kind: str, request: pytest.FixtureRequest, tmp_path: Any) -> Store:
    if kind == "file":
        fs = fsspec.filesystem("file", auto_mkdir=True)
        return Store(f"file://{tmp_path}/data", {}, fs, f"{tmp_path}/data")
    if kind == "memory":
        name = f"t-{uuid.uuid4().hex[:10]}"
        fs = fsspec.filesystem("memory")
        store = Store(f"memory://{name}", {}, fs, f"/{name}")
        request.addfinalizer(lambda: fs.rm(f"/{name}", recursive=True) if fs.exists(f"/{name}") else None)
        return store
    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    options = server.storage_options
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
    return Store(f"s3://{bucket}/data", options, fs, f"{bucket}/data")


@pytest.fixture(params=["file", "memory", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Store:
    return _make_store(request.param, request, tmp_path)


@pytest.fixture
def s3_store(request: pytest.FixtureRequest, tmp_path: Any) -> Store:
    return _make_store("s3", request, tmp_path)


def docs(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {"id": f"doc-{i}", "text": f"document number {i} ünïcode", "n": i} for i in range(start, start + n)
    ]


def jsonl_bytes(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def encode(fmt: str, rows: list[dict[str, Any]]) -> bytes:
    """Serialise rows as `fmt` (a file-name suffix)."""
    if fmt == "jsonl":
        return jsonl_bytes(rows)
    if fmt == "jsonl.gz":
        return gzip.compress(jsonl_bytes(rows))
    if fmt == "jsonl.zst":
        # two concatenated frames, as pzstd writes them
        half = len(rows) // 2
        c = zstandard.ZstdCompressor()
        return c.compress(jsonl_bytes(rows[:half])) + c.compress(jsonl_bytes(rows[half:]))
    if fmt == "parquet":
        sink = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), sink)
        return sink.getvalue()
    if fmt == "csv":
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        return text.getvalue().encode()
    raise AssertionError(fmt)


def read_all(shard: ShardRef, store: Store, **kwargs: Any) -> list[connectors.Record]:
    kwargs.setdefault("text_field", "text")
    return [
        r for batch in read_records(shard, storage_options=store.storage_options, **kwargs) for r in batch
    ]


# --- storage -----------------------------------------------------------------


def test_filesystem_for_resolves_protocols(tmp_path: Any) -> None:
    fs, path = filesystem_for(f"file://{tmp_path}/x.jsonl")
    assert fs.protocol[0] == "file" and path == f"{tmp_path}/x.jsonl"
    fs, path = filesystem_for(str(tmp_path / "x.jsonl"))
    assert path == f"{tmp_path}/x.jsonl"
    fs, path = filesystem_for("memory://bucket/x")
    assert "memory" in fs.protocol
    with pytest.raises(StorageError, match="nope://x"):
        filesystem_for("nope://x")


def test_s3_endpoint_env_only_when_no_endpoint_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENMILL_S3_ENDPOINT_URL", "http://127.0.0.1:1")
    fs, path = filesystem_for("s3://b/k", {"key": "a", "secret": "b"})
    assert path == "b/k"
    assert fs.client_kwargs["endpoint_url"] == "http://127.0.0.1:1"
    fs, _ = filesystem_for("s3://b/k", {"client_kwargs": {"endpoint_url": "http://127.0.0.1:2"}})
    assert fs.client_kwargs["endpoint_url"] == "http://127.0.0.1:2"
    fs, _ = filesystem_for("s3://b/k", {"endpoint_url": "http://127.0.0.1:3"})
    assert "endpoint_url" not in fs.client_kwargs


def test_join_url_keeps_protocol() -> None:
    assert join_url("s3://b/out", "part-00001.parquet") == "s3://b/out/part-00001.parquet"
    assert join_url("s3://b/out/", "/_SUCCESS") == "s3://b/out/_SUCCESS"
    assert join_url("file:///tmp/o", "x") == "file:///tmp/o/x"
    assert join_url("memory://", "x") == "memory://x"
    assert join_url("/tmp/o", "x") == "/tmp/o/x"


def test_with_retries_retries_transient_then_succeeds() -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) <= 2:
            raise ConnectionError("connection reset")
        return "ok"

    assert with_retries(flaky, base_delay=0.001, what="flaky") == "ok"
    assert len(calls) == 3


@pytest.mark.parametrize("exc", [FileNotFoundError("gone"), PermissionError("denied")])
def test_with_retries_does_not_retry_permanent_errors(exc: Exception) -> None:
    calls = []

    def fail() -> None:
        calls.append(1)
        raise exc

    with pytest.raises(type(exc)):
        with_retries(fail, base_delay=0.001, what="fail")
    assert len(calls) == 1


def test_with_retries_gives_up_after_attempts() -> None:
    calls = []

    def down() -> None:
        calls.append(1)
        raise TimeoutError("timed out")

    with pytest.raises(TimeoutError):
        with_retries(down, attempts=3, base_delay=0.001, what="down")
    assert len(calls) == 3


def test_is_transient_classifies_s3_errors() -> None:
    from botocore.exceptions import ClientError, EndpointConnectionError

    def client_error(code: str, status: int) -> ClientError:
        return ClientError(
            {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject"
        )

    assert connectors.is_transient(client_error("InternalError", 500))
    assert connectors.is_transient(client_error("SlowDown", 503))
    assert not connectors.is_transient(client_error("NoSuchKey", 404))
    assert connectors.is_transient(EndpointConnectionError(endpoint_url="http://x"))
    wrapped = OSError(5, "boom")
    wrapped.__cause__ = client_error("InvalidRange", 416)
    assert not connectors.is_transient(wrapped)
    assert not connectors.is_transient(ValueError("bug"))


def test_oserror_without_errno_is_permanent_unless_a_network_error() -> None:
    """pyarrow's corrupt-footer error is an errno-less OSError: retrying it five times only
    delays the shard's failure. Network errors without an errno stay transient."""
    assert not connectors.is_transient(OSError("Couldn't deserialize thrift: TProtocolException: Invalid data"))
    assert connectors.is_transient(ConnectionResetError())
    assert connectors.is_transient(TimeoutError())
    assert connectors.is_transient(OSError(errno.EIO, "I/O error"))


# --- formats and listing -----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "declared", "expected"),
    [
        ("s3://b/a.jsonl", None, ("jsonl", None)),
        ("s3://b/a.JSONL.GZ", None, ("jsonl", "gzip")),
        ("a.ndjson.zst", None, ("jsonl", "zstd")),
        ("a.jsonl.zstd", None, ("jsonl", "zstd")),
        ("a.parquet", None, ("parquet", None)),
        ("a.csv.gz", None, ("csv", "gzip")),
        ("a.json.gz", "jsonl", ("jsonl", "gzip")),
        ("a.txt", "csv", ("csv", None)),
    ],
)
def test_detect_format(name: str, declared: str | None, expected: tuple[str, str | None]) -> None:
    assert detect_format(name, declared) == expected


def test_detect_format_rejects_unknown() -> None:
    with pytest.raises(ValueError, match=r"cannot tell the format of s3://b/a\.txt"):
        detect_format("s3://b/a.txt")
    with pytest.raises(ValueError, match="unknown input format 'xml'"):
        detect_format("a.jsonl", "xml")
    with pytest.raises(ValueError, match="parquet"):
        detect_format("a.parquet.gz")


def test_shard_ref_json_round_trip() -> None:
    shard = ShardRef(3, "s3://b/a.parquet", "parquet", None, row_group=2, fingerprint="10:abc")
    assert ShardRef.from_dict(json.loads(json.dumps(shard.to_dict()))) == shard
    assert shard.basename == "a.parquet"


FORMATS = ["jsonl", "jsonl.gz", "jsonl.zst", "parquet", "csv"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip(store: Store, fmt: str) -> None:
    rows = docs(40)
    data = encode(fmt, rows)
    url = store.put(f"in/docs.{fmt}", data)
    shards = list_shards(url, storage_options=store.storage_options)
    assert len(shards) == 1
    shard = shards[0]
    assert shard.url.startswith(store.base.split("://")[0] + "://")
    assert filesystem_for(shard.url, store.storage_options)[1] == store.path(f"in/docs.{fmt}")
    assert shard.format == fmt.split(".")[0]
    assert shard.fingerprint.startswith(f"{len(data)}:")

    records = read_all(shard, store, id_field="id", batch_size=16)
    assert [r.error for r in records] == [None] * 40
    assert [r.id for r in records] == [r["id"] for r in rows]
    assert [r.row_number for r in records] == list(range(40))
    assert [r.fields["text"] for r in records] == [r["text"] for r in rows]

    out = store.url("out")
    table = pa.Table.from_pylist([{"id": r.id, "text": r.fields["text"]} for r in records])
    written = write_part(
        out, shard.index, table, fingerprint=shard.fingerprint, storage_options=store.storage_options
    )
    assert written == part_url(out, 0) and written.endswith("/out/part-00000.parquet")
    assert part_is_current(out, shard.index, shard.fingerprint, store.storage_options)
    assert read_parts(out, store.storage_options).to_pylist() == table.to_pylist()
    assert store.find() == [f"in/docs.{fmt}", "out/part-00000.parquet"]  # no temp left behind


def _layout(store: Store) -> None:
    store.put("in/b.jsonl", jsonl_bytes(docs(2)))
    store.put("in/a.jsonl.gz", gzip.compress(jsonl_bytes(docs(2))))
    store.put("in/sub/c.parquet", encode("parquet", docs(2)))
    store.put("in/_SUCCESS", b"")
    store.put("in/.hidden.jsonl", b"{}\n")
    store.put("in/_tmp/part-00000.abc.jsonl", b"{}\n")
    store.put("in/README.txt", b"not data")


def test_listing_directory_prefix_is_sorted_and_skips_hidden(store: Store) -> None:
    _layout(store)
    for url in (store.url("in"), store.url("in/")):
        shards = list_shards(url, storage_options=store.storage_options)
        names = [s.url.rsplit("/in/", 1)[1] for s in shards]
        assert names == ["a.jsonl.gz", "b.jsonl", "sub/c.parquet"]
        assert [s.index for s in shards] == [0, 1, 2]
        assert [(s.format, s.compression) for s in shards] == [
            ("jsonl", "gzip"),
            ("jsonl", None),
            ("parquet", None),
        ]
        assert all(s.url.startswith(store.base.split("://")[0] + "://") for s in shards)
    # a second listing (another worker) numbers shards identically
    assert list_shards(store.url("in"), storage_options=store.storage_options) == shards


def test_listing_glob(store: Store) -> None:
    _layout(store)
    shards = list_shards(store.url("in/*.jsonl*"), storage_options=store.storage_options)
    assert [s.url.rsplit("/", 1)[1] for s in shards] == ["a.jsonl.gz", "b.jsonl"]
    assert [s.index for s in shards] == [0, 1]


def test_listing_declared_format_takes_unrecognised_names(store: Store) -> None:
    _layout(store)
    shards = list_shards(store.url("in"), format="jsonl", storage_options=store.storage_options)
    assert [s.url.rsplit("/in/", 1)[1] for s in shards] == ["README.txt", "a.jsonl.gz", "b.jsonl"]


def test_listing_no_match_raises(store: Store) -> None:
    _layout(store)
    with pytest.raises(StorageError, match=r"no input files match .*\*\.csv"):
        list_shards(store.url("in/*.csv"), storage_options=store.storage_options)
    with pytest.raises(StorageError, match="no input files match .*missing"):
        list_shards(store.url("missing"), storage_options=store.storage_options)
    with pytest.raises(ValueError, match="cannot tell the format"):
        list_shards(store.url("in/README.txt"), storage_options=store.storage_options)
    with pytest.raises(ValueError, match="unknown input format 'xml'"):
        list_shards(store.url("in"), format="xml", storage_options=store.storage_options)


@pytest.mark.parametrize("kind", ["memory", "s3"])
def test_parquet_split_by_row_group(kind: str, request: pytest.FixtureRequest, tmp_path: Any) -> None:
    store = _make_store(kind, request, tmp_path)
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(docs(12)), sink, row_group_size=4)
    store.put("in/big.parquet", sink.getvalue())
    store.put("in/small.jsonl", jsonl_bytes(docs(3)))

    whole = list_shards(store.url("in"), storage_options=store.storage_options)
    assert [(s.index, s.row_group) for s in whole] == [(0, None), (1, None)]

    shards = list_shards(store.url("in"), split_row_groups=True, storage_options=store.storage_options)
    assert [(s.index, s.format, s.row_group) for s in shards] == [
        (0, "parquet", 0),
        (1, "parquet", 1),
        (2, "parquet", 2),
        (3, "jsonl", None),
    ]
    # one content fingerprint, but each row group (and the whole file) is its own input
    assert len({s.fingerprint.split("@")[0] for s in shards[:3]}) == 1
    assert len({s.fingerprint for s in shards[:3]} | {whole[0].fingerprint}) == 4
    for shard, first in zip(shards[:3], (0, 4, 8), strict=True):
        records = read_all(shard, store)
        assert [r.row_number for r in records] == list(range(first, first + 4))
        assert [r.id for r in records] == [f"big.parquet:{n}" for n in range(first, first + 4)]
        assert [r.fields["n"] for r in records] == list(range(first, first + 4))


def test_streaming_bounded_batches(tmp_path: Any) -> None:
    path = tmp_path / "big.jsonl.gz"
    path.write_bytes(gzip.compress(jsonl_bytes(docs(20_000))))
    (shard,) = list_shards(str(path))
    batches = read_records(shard, text_field="text", batch_size=100)
    total = 0
    for batch in batches:
        assert 0 < len(batch) <= 100
        total += len(batch)
    assert total == 20_000


def test_reader_is_lazy(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a bounded prefix of the shard is decoded to produce the first batch."""
    path = tmp_path / "big.jsonl"
    path.write_bytes(jsonl_bytes(docs(20_000)))
    (shard,) = list_shards(str(path))
    decoded = []
    real_loads = json.loads
    monkeypatch.setattr(json, "loads", lambda s, *a, **k: decoded.append(1) or real_loads(s, *a, **k))
    first = next(read_records(shard, text_field="text", batch_size=100))
    assert len(first) == 100 and len(decoded) == 100


# --- atomic parts and idempotence ---------------------------------------------


def _table(n: int = 50) -> pa.Table:
    return pa.Table.from_pylist([{"id": f"d{i}", "out": "x" * 100} for i in range(n)])


def _partial_writer(real: Callable[..., None]) -> Callable[..., None]:
    def write_table(table: pa.Table, where: Any, **kwargs: Any) -> None:
        buf = io.BytesIO()
        real(table, buf, **kwargs)
        where.write(buf.getvalue()[: len(buf.getvalue()) // 2])  # half a file, then the "crash"
        raise KeyboardInterrupt("worker killed mid-write")

    return write_table


def test_killed_mid_write_leaves_no_part(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    out = store.url("out")
    monkeypatch.setattr(pq, "write_table", _partial_writer(pq.write_table))
    with pytest.raises(KeyboardInterrupt):
        write_part(out, 17, _table(), fingerprint="1:a", storage_options=store.storage_options)
    assert not store.exists("out/part-00017.parquet")
    assert not part_is_current(out, 17, "1:a", store.storage_options)
    assert store.find() == []  # temp removed
    assert read_parts(out, store.storage_options).num_rows == 0


def test_part_writer_streams_batches_and_commits_atomically(store: Store, tmp_path: Any) -> None:
    out = store.url("out")
    schema = _table(1).schema
    writer = PartWriter(out, 3, schema, fingerprint="f:1", storage_options=store.storage_options)
    local = Path(writer._local)
    for start in (0, 50, 100):
        writer.write(pa.Table.from_pylist([{"id": f"d{i}", "out": "x"} for i in range(start, start + 50)], schema))
        assert not store.exists("out/part-00003.parquet")  # nothing visible until commit
    writer.commit({b"tokenmill.result": b'{"rows": 150}'})

    assert not local.exists()  # the local spool file is gone
    assert part_is_current(out, 3, "f:1", store.storage_options)
    assert read_part_footer(out, 3, store.storage_options)[b"tokenmill.result"] == b'{"rows": 150}'
    assert read_parts(out, store.storage_options).column("id").to_pylist() == [f"d{i}" for i in range(150)]
    assert [p for p in store.find() if "_tmp" in p] == []

    aborted = PartWriter(out, 4, schema, fingerprint="f:2", storage_options=store.storage_options)
    aborted.write(_table(5))
    aborted.abort()
    assert not Path(aborted._local).exists() and not store.exists("out/part-00004.parquet")

    empty = PartWriter(out, 5, schema, fingerprint="f:3", storage_options=store.storage_options)
    empty.commit()
    assert part_is_current(out, 5, "f:3", store.storage_options)


def test_killed_before_move_leaves_no_part(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    out = store.url("out")
    seen_during_write: list[bool] = []
    real = pq.write_table

    def write_then_look(table: pa.Table, where: Any, **kwargs: Any) -> None:
        real(table, where, **kwargs)
        seen_during_write.append(store.exists("out/part-00017.parquet"))

    monkeypatch.setattr(pq, "write_table", write_then_look)

    def killed(*a: Any, **k: Any) -> None:
        raise KeyboardInterrupt("killed between temp write and move")

    monkeypatch.setattr(atomic_mod, "_move", killed)  # a rename, or on object stores a copy + delete
    # a SIGKILL would not run cleanup either: keep the temp to prove readers ignore it
    monkeypatch.setattr(atomic_mod, "_remove_quietly", lambda fs, path: None)
    with pytest.raises(KeyboardInterrupt):
        write_part(out, 17, _table(), fingerprint="1:a", storage_options=store.storage_options)

    assert seen_during_write == [False]  # the complete temp existed, the final key did not
    assert not store.exists("out/part-00017.parquet")
    assert not part_is_current(out, 17, "1:a", store.storage_options)
    leftovers = [p for p in store.find() if p.startswith("out/_tmp/part-00017.")]
    assert len(leftovers) == 1 and leftovers[0].endswith(".parquet")
    assert read_parts(out, store.storage_options).num_rows == 0


def test_failed_rewrite_keeps_previous_part(s3_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    store = s3_store
    out = store.url("out")
    write_part(out, 1, _table(10), fingerprint="10:old", storage_options=store.storage_options)
    monkeypatch.setattr(pq, "write_table", _partial_writer(pq.write_table))
    with pytest.raises(KeyboardInterrupt):
        write_part(out, 1, _table(20), fingerprint="20:new", storage_options=store.storage_options)
    assert part_is_current(out, 1, "10:old", store.storage_options)
    assert not part_is_current(out, 1, "20:new", store.storage_options)
    assert read_parts(out, store.storage_options).num_rows == 10


def test_write_part_retries_transient_failure(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    real = pq.write_table
    calls = []

    def flaky(table: pa.Table, where: Any, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionResetError("connection reset by peer")
        real(table, where, **kwargs)

    monkeypatch.setattr(pq, "write_table", flaky)
    monkeypatch.setattr("connectors.storage.time.sleep", lambda s: None)
    out = store.url("out")
    write_part(out, 2, _table(5), fingerprint="5:x", storage_options=store.storage_options)
    assert len(calls) == 2
    assert part_is_current(out, 2, "5:x", store.storage_options)
    assert store.find() == ["out/part-00002.parquet"]  # the failed attempt's temp is gone


def test_part_is_current_tracks_fingerprint(store: Store) -> None:
    url = store.put("in/a.jsonl", jsonl_bytes(docs(5)))
    (shard,) = list_shards(url, storage_options=store.storage_options)
    out = store.url("out")
    assert not part_is_current(out, 0, shard.fingerprint, store.storage_options)
    write_part(out, 0, _table(5), fingerprint=shard.fingerprint, storage_options=store.storage_options)
    assert part_is_current(out, 0, shard.fingerprint, store.storage_options)

    store.put("in/a.jsonl", jsonl_bytes(docs(6)))  # the input object changes
    (changed,) = list_shards(url, storage_options=store.storage_options)
    assert changed.fingerprint != shard.fingerprint
    assert not part_is_current(out, 0, changed.fingerprint, store.storage_options)


def test_identical_copies_with_the_same_mtime_are_different_inputs(tmp_path: Any) -> None:
    """A `cp -p` copy has the same size and mtime; its part must not count for the original."""
    import os

    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "a.jsonl").write_bytes(jsonl_bytes(docs(3)))
    (inp / "b.jsonl").write_bytes(jsonl_bytes(docs(3)))
    stamp = (inp / "a.jsonl").stat().st_mtime_ns
    os.utime(inp / "b.jsonl", ns=(stamp, stamp))
    a, b = list_shards(str(inp))
    assert a.fingerprint.split("@")[0] == b.fingerprint.split("@")[0]
    write_part(str(tmp_path / "out"), 0, _table(3), fingerprint=a.fingerprint)
    assert part_is_current(str(tmp_path / "out"), 0, a.fingerprint)
    assert not part_is_current(str(tmp_path / "out"), 0, b.fingerprint)


def test_same_size_rewrite_changes_s3_fingerprint(s3_store: Store) -> None:
    url = s3_store.put("in/a.jsonl", b'{"text": "aaaa"}\n')
    (before,) = list_shards(url, storage_options=s3_store.storage_options)
    s3_store.put("in/a.jsonl", b'{"text": "bbbb"}\n')
    (after,) = list_shards(url, storage_options=s3_store.storage_options)
    assert before.fingerprint.split(":")[0] == after.fingerprint.split(":")[0]
    assert before.fingerprint != after.fingerprint


def test_part_names() -> None:
    assert part_name(17) == "part-00017.parquet"
    assert part_url("s3://b/out/", 3) == "s3://b/out/part-00003.parquet"
    with pytest.raises(ValueError):
        part_name(-1)


# --- manifest, marker, reports --------------------------------------------------


def test_manifest_marker_and_text(store: Store) -> None:
    out = store.url("out")
    opts = store.storage_options
    assert read_manifest(out, opts) is None
    assert not success_marker_exists(out, opts)

    manifest = {"job": "j1", "shards": [{"index": 0, "rows": 3}], "note": "ünïcode"}
    write_manifest(out, manifest, opts)
    assert read_manifest(out, opts) == manifest
    raw = store.fs.cat_file(store.path("out/_manifest.json")).decode()
    assert raw == json.dumps(manifest, indent=2) + "\n"

    write_manifest(out, {"job": "j1", "done": True}, opts)  # replace
    assert read_manifest(out, opts) == {"job": "j1", "done": True}

    write_success_marker(out, opts)
    assert success_marker_exists(out, opts)
    assert store.fs.cat_file(store.path("out/_SUCCESS")) == b""

    write_text(store.url("out/report.txt"), "3 rows\n", opts)
    assert store.fs.cat_file(store.path("out/report.txt")) == b"3 rows\n"
    assert [p for p in store.find() if "_tmp" in p] == []


def test_corrupt_manifest_is_a_storage_error(store: Store) -> None:
    store.put("out/_manifest.json", b"{not json")
    with pytest.raises(StorageError, match="corrupt manifest .*_manifest.json"):
        read_manifest(store.url("out"), store.storage_options)


def test_public_api_exports() -> None:
    for name in connectors.__all__:
        assert hasattr(connectors, name), name


def test_unreachable_s3_is_transient_not_a_shard_error(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An endpoint that refuses connections: every attempt fails with a retryable error."""
    from s3_server import free_port

    opts = {**s3_server.storage_options, "config_kwargs": {"retries": {"max_attempts": 1}}}
    opts["client_kwargs"] = {"endpoint_url": f"http://127.0.0.1:{free_port()}"}  # nothing listens there
    shard = connectors.ShardRef(0, "s3://no-server/a.jsonl", "jsonl", None, fingerprint="1:x@s3://no-server/a.jsonl")
    sleeps: list[float] = []
    monkeypatch.setattr("connectors.storage.time.sleep", sleeps.append)
    with pytest.raises(Exception) as info:
        read_records(shard, text_field="text", storage_options=opts)
    assert not isinstance(info.value, StorageError)
    assert connectors.is_transient(info.value)
    assert len(sleeps) == 4  # five attempts


def _frozen_for(server: Any, seconds: float) -> threading.Timer:
    """Freeze the S3 server process now and thaw it after ``seconds``."""
    server.pause()
    timer = threading.Timer(seconds, server.resume)
    timer.start()
    return timer


# Freezes last 2 s, twice the read timeout: at least one attempt times out and is retried.
HUNG_SERVER_OPTS = {"config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1, "read_timeout": 1}}


def test_s3_frozen_during_a_read_recovers(s3_server: Any, s3_bucket: str) -> None:
    """The server stops answering for a few seconds while a shard is read: retried, no row lost."""
    opts = {**s3_server.storage_options, **HUNG_SERVER_OPTS}
    fsspec.filesystem("s3", skip_instance_cache=True, **opts).pipe(f"{s3_bucket}/a.jsonl", jsonl_bytes(docs(3)))
    (shard,) = list_shards(f"s3://{s3_bucket}/a.jsonl", storage_options=opts)
    timer = _frozen_for(s3_server, 2.0)
    try:
        records = [r for b in read_records(shard, text_field="text", storage_options=opts) for r in b]
    finally:
        timer.join()
    assert [r.fields["text"] for r in records] == [d["text"] for d in docs(3)]


def test_s3_frozen_during_a_part_commit_recovers(s3_server: Any, s3_bucket: str) -> None:
    """The server stops answering while a part is committed: the commit is retried and lands whole."""
    opts = {**s3_server.storage_options, **HUNG_SERVER_OPTS}
    out = f"s3://{s3_bucket}/out"
    timer = _frozen_for(s3_server, 2.0)
    try:
        write_part(out, 4, _table(20), fingerprint="20:x@in", storage_options=opts)
    finally:
        timer.join()
    assert part_is_current(out, 4, "20:x@in", opts)
    assert read_parts(out, storage_options=opts).num_rows == 20
