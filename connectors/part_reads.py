"""Reading the rows of a job's parts: all of them (tests, status), some columns of some parts
(a job's summary), the first rows of one (the console), or what an earlier run's part can
spare the next one. Writing a part and its footer is ``connectors.parquet_sink``."""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from connectors.manifest import read_manifest
from connectors.parquet_sink import PartId, part_id_of, part_url
from connectors.storage import StorageError, filesystem_for, with_retries

log = logging.getLogger(__name__)


def read_part_if_any(
    output_url: str, part: PartId, columns: list[str], storage_options: dict | None = None
) -> pa.Table | None:
    """Those of ``columns`` that a part has, or None if there is no part or it cannot be read
    (an earlier run's part, read for what it can spare the next one)."""
    url = part_url(output_url, part)
    fs, path = filesystem_for(url, storage_options)
    fs.invalidate_cache(path)

    def read() -> pa.Table:
        with fs.open(path, "rb") as f:
            pf = pq.ParquetFile(f)
            return pf.read(columns=[c for c in columns if c in pf.schema_arrow.names])

    try:
        return with_retries(read, what=f"read {url}")
    except FileNotFoundError:
        return None
    except Exception as exc:
        log.warning("cannot read the previous part %s: %s", url, exc)
        return None


def read_parts(
    output_url: str, storage_options: dict | None = None, parts: list[str] | None = None
) -> pa.Table:
    """The job's parts concatenated in shard order (for tests and status): the part file names
    given, else those the manifest lists, else every `part-*.parquet` under `output_url`."""
    fs, base = filesystem_for(output_url, storage_options)
    base = base.rstrip("/")
    fs.invalidate_cache()
    if parts is None:
        manifest = read_manifest(output_url, storage_options)
        parts = manifest.get("parts") if manifest else None
    if parts is not None:
        paths = [posixpath.join(base, name) for name in parts]
    else:
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
    output_url: str, parts: list[PartId], columns: list[str], storage_options: dict | None = None
) -> pa.Table | None:
    """Some columns of the given parts, in the order given (None when no part is given): for
    summaries over a job's output that need its counts and scores, not its text."""
    tables = []
    for index in parts:
        url = part_url(output_url, index)
        fs, path = filesystem_for(url, storage_options)

        def read(fs=fs, path=path) -> pa.Table:
            with fs.open(path, "rb") as f:
                return pq.read_table(f, columns=columns).replace_schema_metadata(None)

        tables.append(with_retries(read, what=f"read {url}"))
    return pa.concat_tables(tables, promote_options="permissive") if tables else None


def iter_part_column(
    output_url: str, parts: list[PartId], column: str, storage_options: dict | None = None, batch_rows: int = 8192
) -> Iterator[list]:
    """One column's values of the given parts, a batch of rows at a time: a pass over a large
    output (every error of a million-row part) in bounded memory."""
    for index in parts:
        fs, path = filesystem_for(part_url(output_url, index), storage_options)
        with fs.open(path, "rb") as f:
            parquet = pq.ParquetFile(f, pre_buffer=False, buffer_size=1 << 20)  # read as decoded, not whole
            for batch in parquet.iter_batches(batch_size=batch_rows, columns=[column]):
                yield batch.column(0).to_pylist()


def read_part_head(
    output_url: str, part: PartId, columns: list[str], count: int, storage_options: dict | None = None
) -> list[dict]:
    """The first ``count`` rows of a part (only ``columns``), reading one batch, not the part."""
    url = part_url(output_url, part)
    fs, path = filesystem_for(url, storage_options)

    def read() -> list[dict]:
        with fs.open(path, "rb") as f:
            for batch in pq.ParquetFile(f).iter_batches(batch_size=count, columns=columns):
                return batch.to_pylist()[:count]
        return []

    return with_retries(read, what=f"read {url}")


def list_part_sizes(output_url: str, storage_options: dict | None = None, *,
                    with_lines: bool = False) -> dict[str, int]:
    """Every ``part-<id>.parquet`` under the output, by part id, with its size in bytes: whatever
    run wrote it (for reads of a whole output that must stay bounded). ``with_lines``: plus the
    size of its ``part-<id>.jsonl`` lines, where there are any (they are read too)."""
    fs, base = filesystem_for(output_url, storage_options)
    fs.invalidate_cache()
    pattern = posixpath.join(base.rstrip("/"), "part-*")
    try:
        found = with_retries(lambda: fs.glob(pattern, detail=True), what=f"list parts of {output_url}")
    except FileNotFoundError:
        return {}
    files = {posixpath.basename(p): int(info.get("size") or 0) for p, info in found.items()
             if info.get("type", "file") == "file"}
    sizes = {part_id_of(name): size for name, size in files.items() if name.endswith(".parquet")}
    if with_lines:
        for part in sizes:
            sizes[part] += files.get(f"part-{part}.jsonl", 0)
    return sizes
