"""Checkpoints inside a shard: its finished rows committed while it runs, so a worker that is
killed or drained loses only the rows since the last checkpoint, not the shard.

A shard's checkpoint lives under ``<output>/_checkpoints/<part id>/``: immutable chunks
``chunk-<start>-<end>-<uuid>.parquet`` (rows ``[start, end)`` of the part, in input order,
with the part's schema; ``.jsonl`` beside it for the OpenAI lines of a plan that writes
them) and one record, ``checkpoint.json``, naming the chunks in order with each one's size
and SHA-256. A checkpoint writes its chunk first, then replaces the record (both atomically),
so the record only ever names whole chunks; a chunk it does not name is litter.

The folder starts with ``_``: input listings, part globs and stale-part removal never see
it, so no reader takes a chunk for a part. ``load`` trusts a chunk only if the record is the
same part fingerprint (input version and plan), its bytes hash to what the record says and
its own footer names the same fingerprint and rows; the first chunk that fails any of that
(missing, corrupt, another plan's or another input version's) and every chunk after it are
recomputed. ``clear`` removes the folder once the shard's part is committed.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import posixpath
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from connectors.atomic import atomic_write, pause_point, remove_empty_folder
from connectors.parquet_sink import FINGERPRINT_KEY, PartId, part_id_of, part_name
from connectors.storage import filesystem_for, join_url, with_retries

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "_checkpoints"
RECORD_NAME = "checkpoint.json"
ROWS_KEY = b"tokenmill.rows"
# Test seam for fault tests, never set in production: pause between a chunk and its record.
PAUSE_ENV = "TOKENMILL_TEST_PAUSE_CHECKPOINT"


@dataclass(frozen=True)
class ChunkEntry:
    """One chunk as the record names it."""

    name: str
    start: int
    end: int
    size: int
    sha256: str
    lines: str | None = None  # the OpenAI lines file beside it, if the plan writes them
    lines_sha256: str | None = None


@dataclass
class LoadedChunk:
    """A chunk that passed every check: its rows, and its OpenAI lines if it has them."""

    entry: ChunkEntry
    table: pa.Table
    lines: list[dict[str, Any]] | None


def checkpoint_url(output_url: str, part: PartId) -> str:
    """``<output>/_checkpoints/<part id>``."""
    return join_url(output_url, f"{CHECKPOINT_DIR}/{part_id_of(part_name(part))}")


class ShardCheckpoint:
    """The checkpoint of one shard's part under one fingerprint (input version + plan)."""

    def __init__(self, output_url: str, part: PartId, fingerprint: str, storage_options: dict | None = None) -> None:
        self.url = checkpoint_url(output_url, part)
        self.fingerprint = fingerprint
        self.storage_options = storage_options
        self.fs, self.path = filesystem_for(self.url, storage_options)
        self.chunks: list[ChunkEntry] = []  # trusted and written so far, in order

    @property
    def end(self) -> int:
        """Rows ``[0, end)`` of the part are committed in chunks."""
        return self.chunks[-1].end if self.chunks else 0

    # ---- reading --------------------------------------------------------------------------------
    def _read(self, name: str) -> bytes:
        path = posixpath.join(self.path, name)

        def read() -> bytes:
            with self.fs.open(path, "rb") as f:
                return f.read()

        return with_retries(read, what=f"read {self.url}/{name}")

    def _record(self) -> list[ChunkEntry]:
        """The chunks the record names, if it is this fingerprint's; [] if absent or foreign."""
        self.fs.invalidate_cache(self.path)
        try:
            record = json.loads(self._read(RECORD_NAME))
        except FileNotFoundError:
            return []
        except Exception as exc:
            log.warning("checkpoint record of %s unreadable, recomputing the shard: %s", self.url, exc)
            return []
        if not isinstance(record, dict) or record.get("fingerprint") != self.fingerprint:
            log.info("checkpoint of %s is another input version's or plan's: recomputing", self.url)
            return []
        try:
            return [ChunkEntry(**c) for c in record.get("chunks", [])]
        except TypeError as exc:
            log.warning("checkpoint record of %s malformed, recomputing the shard: %s", self.url, exc)
            return []

    def recorded_rows(self) -> int:
        """Rows ``[0, n)`` the record names for this fingerprint (chunks unverified): for status."""
        chunks = self._record()
        return chunks[-1].end if chunks else 0

    def _verified(self, entry: ChunkEntry, start: int) -> LoadedChunk:
        """The chunk's rows and lines, or ValueError naming what does not hold."""
        if entry.start != start or entry.end <= start:
            raise ValueError(f"covers rows {entry.start}-{entry.end}, expected to start at {start}")
        data = self._read(entry.name)
        if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
            raise ValueError("content differs from the record (corrupt or replaced)")
        pf = pq.ParquetFile(io.BytesIO(data))
        meta = pf.schema_arrow.metadata or {}
        if meta.get(FINGERPRINT_KEY) != self.fingerprint.encode() or meta.get(ROWS_KEY) != f"{start}-{entry.end}".encode():
            raise ValueError("written for another input version, plan or rows")
        table = pf.read().replace_schema_metadata(None)
        if table.num_rows != entry.end - start:
            raise ValueError(f"holds {table.num_rows} rows, expected {entry.end - start}")
        lines = None
        if entry.lines is not None:
            raw = self._read(entry.lines)
            if hashlib.sha256(raw).hexdigest() != entry.lines_sha256:
                raise ValueError("its lines differ from the record")
            lines = [json.loads(line) for line in raw.splitlines() if line.strip()]
            if len(lines) != table.num_rows:
                raise ValueError(f"holds {len(lines)} lines for {table.num_rows} rows")
        return LoadedChunk(entry, table, lines)

    def load(self, schema: pa.Schema, with_lines: bool) -> Iterator[LoadedChunk]:
        """The trusted chunks in order, one at a time (so a long checkpoint never sits in memory);
        stops at the first chunk that fails a check. ``self.chunks`` grows as they are yielded."""
        self.chunks = []
        for entry in self._record():
            try:
                chunk = self._verified(entry, self.end)
                if with_lines != (chunk.lines is not None):
                    raise ValueError("its OpenAI lines do not match the plan")
                chunk.table = chunk.table.select(schema.names).cast(schema)
            except FileNotFoundError:
                log.warning("checkpoint chunk %s/%s is missing: recomputing from row %d", self.url, entry.name,
                            self.end)
                return
            except Exception as exc:
                log.warning("checkpoint chunk %s/%s not trusted (%s): recomputing from row %d", self.url,
                            entry.name, exc, self.end)
                return
            self.chunks.append(entry)
            yield chunk

    # ---- writing --------------------------------------------------------------------------------
    def _write(self, name: str, data: bytes) -> None:
        atomic_write(self.fs, posixpath.join(self.path, name), lambda f: f.write(data), what=f"{self.url}/{name}")

    def save(self, table: pa.Table, start: int, lines: list[dict[str, Any]] | None = None) -> ChunkEntry:
        """Commit rows ``[start, start + len(table))``: the chunk, then the record naming it."""
        if start != self.end:
            raise ValueError(f"a chunk must start at row {self.end}, not {start}")
        end = start + table.num_rows
        stem = f"chunk-{start:09d}-{end:09d}-{uuid.uuid4().hex[:12]}"
        meta = {FINGERPRINT_KEY: self.fingerprint.encode(), ROWS_KEY: f"{start}-{end}".encode()}
        buf = io.BytesIO()
        pq.write_table(table.replace_schema_metadata({**(table.schema.metadata or {}), **meta}), buf,
                       compression="zstd")
        data = buf.getvalue()
        lines_name = lines_sha = None
        if lines is not None:
            raw = "".join(json.dumps(line, ensure_ascii=False, default=str) + "\n" for line in lines).encode()
            lines_name, lines_sha = f"{stem}.jsonl", hashlib.sha256(raw).hexdigest()
            self._write(lines_name, raw)
        self._write(f"{stem}.parquet", data)
        entry = ChunkEntry(f"{stem}.parquet", start, end, len(data), hashlib.sha256(data).hexdigest(),
                           lines_name, lines_sha)
        pause_point(PAUSE_ENV, posixpath.join(self.path, entry.name))
        record = {"fingerprint": self.fingerprint, "chunks": [asdict(c) for c in [*self.chunks, entry]]}
        self._write(RECORD_NAME, json.dumps(record, indent=1).encode())
        self.chunks.append(entry)
        return entry

    def clear(self) -> None:
        """Remove the shard's checkpoint folder (its part is committed); best effort."""
        try:
            self.fs.invalidate_cache(self.path)
            if with_retries(lambda: self.fs.exists(self.path), what=f"check {self.url}"):
                with_retries(lambda: self.fs.rm(self.path, recursive=True), what=f"remove {self.url}")
        except FileNotFoundError:
            pass
        except Exception as exc:  # litter under a folder no reader lists; the part is what counts
            log.warning("could not remove checkpoint %s: %s", self.url, exc)
        finally:
            self.fs.invalidate_cache(self.path)
        remove_empty_folder(self.fs, posixpath.dirname(self.path))  # the last shard's leaves no `_checkpoints/`
        self.chunks = []
