"""Parquet output parts: one atomically committed file per input shard.

Each part records the input shard's fingerprint in its footer, so a re-run can
skip shards whose part is already current by reading only the footer.
"""

from __future__ import annotations

import posixpath

import pyarrow as pa
import pyarrow.parquet as pq

from connectors.atomic import atomic_write
from connectors.storage import StorageError, filesystem_for, is_transient, join_url, with_retries

FINGERPRINT_KEY = b"tokenmill.fingerprint"


def part_name(shard_index: int) -> str:
    """`part-00017.parquet`: zero-padded so names sort like shard numbers."""
    if shard_index < 0:
        raise ValueError(f"shard index must be >= 0, got {shard_index}")
    return f"part-{shard_index:05d}.parquet"


def part_url(output_url: str, shard_index: int) -> str:
    return join_url(output_url, part_name(shard_index))


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
    metadata = dict(table.schema.metadata or {})
    metadata[FINGERPRINT_KEY] = fingerprint.encode("utf-8")
    table = table.replace_schema_metadata(metadata)
    atomic_write(fs, path, lambda f: pq.write_table(table, f, compression="zstd"), what=url)
    return url


def part_is_current(
    output_url: str, shard_index: int, fingerprint: str, storage_options: dict | None = None
) -> bool:
    """True iff the part exists and was written from input with this fingerprint (footer read only)."""
    url = part_url(output_url, shard_index)
    fs, path = filesystem_for(url, storage_options)
    fs.invalidate_cache(path)

    def stored() -> bytes | None:
        with fs.open(path, "rb") as f:
            return (pq.read_metadata(f).metadata or {}).get(FINGERPRINT_KEY)

    try:
        value = with_retries(stored, what=f"read footer of {url}")
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
