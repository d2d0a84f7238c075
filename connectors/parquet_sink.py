"""Parquet output parts: one atomically committed file per input shard.

A part is named by its shard's ``part_id`` (``part-<id>.parquet``, see ``ShardRef``),
which does not move when other inputs come and go. Each part records the input
shard's fingerprint in its footer, so a re-run can skip shards whose part is already
current by reading only the footer; next to it the footer can keep the shard's *result*
(any small JSON object, the pipeline's counts), so a skipped shard is still counted
without reading its rows. The job manifest lists the parts that belong to the job;
``remove_stale_parts`` deletes the others.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterable
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from connectors.atomic import atomic_write
from connectors.storage import filesystem_for, is_transient, join_url, with_retries

log = logging.getLogger(__name__)

FINGERPRINT_KEY = b"tokenmill.fingerprint"
RESULT_KEY = b"tokenmill.result"
COMMIT_KEY = b"tokenmill.commit"  # a fresh id per write: the part's identity beyond its name
LINES_KEY = b"tokenmill.lines_sha256"  # the digest of the part's JSON lines, written after it
COPY_CHUNK = 1 << 20
_PART_FILE = re.compile(r"^part-([A-Za-z0-9_-]+)\.[a-z]+$")
# What the pipeline writes (part ids, and the numbered parts of earlier versions): the only
# files stale-part removal may delete, whatever else shares the folder.
_OWN_PART_FILE = re.compile(r"^part-([0-9a-f]{16}|[0-9]{5})\.(parquet|jsonl)$")

# A part's identity: a ShardRef.part_id (str), or a plain number (zero-padded, for callers
# that number their own parts).
PartId = int | str


def part_name(part: PartId, ext: str = "parquet") -> str:
    """`part-<id>.parquet` (`part-00017.parquet` for a number)."""
    if isinstance(part, int):
        if part < 0:
            raise ValueError(f"shard index must be >= 0, got {part}")
        part = f"{part:05d}"
    if not re.fullmatch(r"[A-Za-z0-9_-]+", part):
        raise ValueError(f"part id must be letters, digits, '_' or '-', got {part!r}")
    return f"part-{part}.{ext}"


def part_id_of(name: str) -> str:
    """The id in a part file name (`part-<id>.parquet` -> `<id>`)."""
    match = _PART_FILE.match(name)
    if match is None:
        raise ValueError(f"not a part file name: {name!r}")
    return match.group(1)


def part_url(output_url: str, part: PartId) -> str:
    return join_url(output_url, part_name(part))


def _with_fingerprint(schema: pa.Schema, fingerprint: str) -> pa.Schema:
    """The part's schema with the input fingerprint in its metadata (stored in the footer)."""
    return schema.with_metadata({**(schema.metadata or {}), FINGERPRINT_KEY: fingerprint.encode("utf-8")})


def write_part(
    output_url: str,
    part: PartId,
    table: pa.Table,
    *,
    fingerprint: str,
    storage_options: dict | None = None,
) -> str:
    """Write `table` as the part for `part` via temp + move; returns the final URL."""
    url = part_url(output_url, part)
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
        part: PartId,
        schema: pa.Schema,
        *,
        fingerprint: str,
        storage_options: dict | None = None,
    ) -> None:
        self.url = part_url(output_url, part)
        self.storage_options = storage_options
        self.commit_id = uuid.uuid4().hex
        fd, self._local = tempfile.mkstemp(prefix=f"tokenmill-{part_name(part)}-", suffix=".tmp")
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

    def commit_with_result(self, result: dict[str, Any], lines_sha256: str | None = None) -> str:
        """``commit`` with the shard's ``result`` (JSON-safe, read back by ``read_part_result``), this
        write's ``commit_id`` and the digest of the part's JSON lines (if any) in the footer."""
        metadata = {RESULT_KEY: json.dumps(result).encode("utf-8"), COMMIT_KEY: self.commit_id.encode("ascii")}
        if lines_sha256 is not None:
            metadata[LINES_KEY] = lines_sha256.encode("ascii")
        return self.commit(metadata)

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


def read_part_footer(output_url: str, part: PartId, storage_options: dict | None = None) -> dict[bytes, bytes]:
    """The key-value metadata in a part's footer (one small read of the object as it is now)."""
    url = part_url(output_url, part)
    fs, path = filesystem_for(url, storage_options)
    fs.invalidate_cache(path)

    def read() -> dict[bytes, bytes]:
        with fs.open(path, "rb") as f:
            return pq.read_metadata(f).metadata or {}

    return with_retries(read, what=f"read footer of {url}")


def read_part_result(output_url: str, part: PartId, storage_options: dict | None = None) -> dict[str, Any]:
    """The result ``PartWriter.commit`` stored in the part's footer; empty if it has none."""
    raw = read_part_footer(output_url, part, storage_options).get(RESULT_KEY)
    return json.loads(raw) if raw else {}




def part_is_current(
    output_url: str, part: PartId, fingerprint: str, storage_options: dict | None = None
) -> bool:
    """True iff the part exists and was written from input with this fingerprint (footer read only)."""
    try:
        value = read_part_footer(output_url, part, storage_options).get(FINGERPRINT_KEY)
    except FileNotFoundError:
        return False
    except Exception as exc:
        if isinstance(exc, PermissionError) or is_transient(exc):
            raise
        return False  # unreadable or foreign file: not current, it will be rewritten
    return value == fingerprint.encode("utf-8")


def remove_stale_parts(output_url: str, keep: Iterable[PartId], storage_options: dict | None = None) -> list[str]:
    """Delete every part file (`part-<id>.parquet` / `.jsonl`, ids as the pipeline writes them)
    under `output_url` whose id is not in `keep`: parts of inputs that are gone, or of the
    older numbered naming. Returns the names removed."""
    keep_ids = {part_id_of(part_name(p)) for p in keep}
    fs, base = filesystem_for(output_url, storage_options)
    base = base.rstrip("/")
    fs.invalidate_cache()
    paths = with_retries(lambda: fs.glob(posixpath.join(base, "part-*")), what=f"list parts of {output_url}")
    removed = []
    for path in sorted(paths):
        match = _OWN_PART_FILE.match(posixpath.basename(path))
        if match and match.group(1) not in keep_ids:
            with_retries(lambda p=path: fs.rm_file(p), what=f"remove stale part {fs.unstrip_protocol(path)}")
            removed.append(posixpath.basename(path))
    if removed:
        log.info("removed %d stale parts from %s: %s", len(removed), output_url, ", ".join(removed))
        fs.invalidate_cache()
    return removed
