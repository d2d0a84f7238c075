"""Parquet output parts: one atomically committed file per input shard.

Each part records the input shard's fingerprint in its footer, so a re-run can
skip shards whose part is already current by reading only the footer.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import tempfile
from typing import IO

import pyarrow as pa
import pyarrow.parquet as pq

from connectors.atomic import atomic_write
from connectors.storage import StorageError, filesystem_for, is_transient, join_url, with_retries

FINGERPRINT_KEY = b"tokenmill.fingerprint"
COPY_CHUNK = 1 << 20


def part_name(shard_index: int) -> str:
    """`part-00017.parquet`: zero-padded so names sort like shard numbers."""
    if shard_index < 0:
        raise ValueError(f"shard index must be >= 0, got {shard_index}")
    return f"part-{shard_index:05d}.parquet"


def part_url(output_url: str, shard_index: int) -> str:
    return join_url(output_url, part_name(shard_index))


def _with_fingerprint(schema: pa.Schema, fingerprint: str) -> pa.Schema:
    """The part's schema with the input fingerprint in its metadata (stored in the footer)."""
    return schema.with_metadata({**(schema.metadata or {}), FINGERPRINT_KEY: fingerprint.encode("utf-8")})


def write_part(
    output_url: str,
    shard_index: int,
    table: pa.Table,
    *,
    fingerprint: str,
    storage_options: dict | None = None,
) -> str:
    """Write `table` as the part for `shard_index` via temp + move; returns the final URL."""
    url = part_url(output_url, shard_index)
    fs, path = filesystem_for(url, storage_options)
    table = table.replace_schema_metadata(_with_fingerprint(table.schema, fingerprint).metadata)
    atomic_write(fs, path, lambda f: pq.write_table(table, f, compression="zstd"), what=url)
    return url


class PartWriter:
    """A part written while its rows are produced, so a shard's output never sits in memory.

    Row batches go to a local temporary Parquet file; ``commit`` adds the footer metadata
    and moves the file onto the part's key with the same temp + move as ``write_part``
    (readers see no part or the complete one). ``abort`` throws it away.
    """

    def __init__(
        self,
        output_url: str,
        shard_index: int,
        schema: pa.Schema,
        *,
        fingerprint: str,
        storage_options: dict | None = None,
    ) -> None:
        self.url = part_url(output_url, shard_index)
        self.storage_options = storage_options
        fd, self._local = tempfile.mkstemp(prefix=f"tokenmill-{part_name(shard_index)}-", suffix=".tmp")
        os.close(fd)
        self._writer: pq.ParquetWriter | None = None
        try:
            self._writer = pq.ParquetWriter(self._local, _with_fingerprint(schema, fingerprint), compression="zstd")
        except BaseException:
            self.abort()
            raise

    def write(self, table: pa.Table) -> None:
        assert self._writer is not None, "part already committed or aborted"
        self._writer.write_table(table)

    def commit(self, metadata: dict[bytes, bytes] | None = None) -> str:
        """Finish the file with ``metadata`` in its footer and move it to the part's URL."""
        assert self._writer is not None, "part already committed or aborted"
        try:
            if metadata:
                self._writer.add_key_value_metadata(metadata)
            self._writer.close()
            self._writer = None
            fs, path = filesystem_for(self.url, self.storage_options)

            def copy(f: IO[bytes]) -> None:
                with open(self._local, "rb") as src:
                    shutil.copyfileobj(src, f, COPY_CHUNK)

            atomic_write(fs, path, copy, what=self.url)
            return self.url
        finally:
            self.abort()

    def abort(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # already broken: the file is discarded anyway
                pass
            self._writer = None
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._local)


def read_part_footer(output_url: str, shard_index: int, storage_options: dict | None = None) -> dict[bytes, bytes]:
    """The key-value metadata in a part's footer (one small read of the object as it is now)."""
    url = part_url(output_url, shard_index)
    fs, path = filesystem_for(url, storage_options)
    fs.invalidate_cache(path)

    def read() -> dict[bytes, bytes]:
        with fs.open(path, "rb") as f:
            return pq.read_metadata(f).metadata or {}

    return with_retries(read, what=f"read footer of {url}")


def part_is_current(
    output_url: str, shard_index: int, fingerprint: str, storage_options: dict | None = None
) -> bool:
    """True iff the part exists and was written from input with this fingerprint (footer read only)."""
    try:
        value = read_part_footer(output_url, shard_index, storage_options).get(FINGERPRINT_KEY)
    except FileNotFoundError:
        return False
    except Exception as exc:
        if isinstance(exc, PermissionError) or is_transient(exc):
            raise
        return False  # unreadable or foreign file: not current, it will be rewritten
    return value == fingerprint.encode("utf-8")


def read_parts(output_url: str, storage_options: dict | None = None) -> pa.Table:
    """All `part-*.parquet` under `output_url`, concatenated in part order (for tests and status)."""
    fs, base = filesystem_for(output_url, storage_options)
    base = base.rstrip("/")
    fs.invalidate_cache()
    pattern = posixpath.join(base, "part-*.parquet")
    paths = sorted(with_retries(lambda: fs.glob(pattern), what=f"list parts of {output_url}"))

    def read(path: str) -> pa.Table:
        with fs.open(path, "rb") as f:
            return pq.read_table(f).replace_schema_metadata(None)

    tables = []
    for path in paths:
        try:
            tables.append(with_retries(lambda p=path: read(p), what=f"read {fs.unstrip_protocol(path)}"))
        except (FileNotFoundError, PermissionError) as exc:
            raise StorageError(f"cannot read part {fs.unstrip_protocol(path)}: {exc}", output_url) from exc
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="permissive")


def read_part_columns(
    output_url: str, shard_indices: list[int], columns: list[str], storage_options: dict | None = None
) -> pa.Table | None:
    """Some columns of the given parts, in part order (None when no part is given): for
    summaries over a job's output that need its counts and scores, not its text."""
    tables = []
    for index in sorted(shard_indices):
        url = part_url(output_url, index)
        fs, path = filesystem_for(url, storage_options)

        def read(fs=fs, path=path) -> pa.Table:
            with fs.open(path, "rb") as f:
                return pq.read_table(f, columns=columns).replace_schema_metadata(None)

        tables.append(with_retries(read, what=f"read {url}"))
    return pa.concat_tables(tables, promote_options="permissive") if tables else None


def read_part_head(
    output_url: str, shard_index: int, columns: list[str], count: int, storage_options: dict | None = None
) -> list[dict]:
    """The first ``count`` rows of a part (only ``columns``), reading one batch, not the part."""
    url = part_url(output_url, shard_index)
    fs, path = filesystem_for(url, storage_options)

    def read() -> list[dict]:
        with fs.open(path, "rb") as f:
            for batch in pq.ParquetFile(f).iter_batches(batch_size=count, columns=columns):
                return batch.to_pylist()[:count]
        return []

    return with_retries(read, what=f"read {url}")

