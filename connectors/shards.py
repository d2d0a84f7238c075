"""Input listing: turn a file, glob or prefix into a stable, numbered list of shards.

Shard numbers are positions in a listing sorted by URL, so every worker of one run
agrees on which shard is which without coordinating. They move when inputs come and
go, so a shard's output part is named by ``part_id`` instead: a hash of the shard's URL
(without credentials) and row group, the same in every run that lists that input.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import posixpath
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import fsspec
import pyarrow.parquet as pq

from connectors.storage import StorageError, filesystem_for, is_transient, public_url, with_retries
from connectors.url_policy import stays_under

log = logging.getLogger(__name__)

_COMPRESSIONS = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd"}
_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}
_DECLARED = {"jsonl": "jsonl", "ndjson": "jsonl", "json": "jsonl", "parquet": "parquet", "csv": "csv"}
_GLOB_CHARS = "*?["


@dataclass(frozen=True)
class ShardRef:
    """One unit of work: a whole input file, or one row group of a big parquet file."""

    index: int
    url: str
    format: str
    compression: str | None
    row_group: int | None = None
    fingerprint: str = ""

    @property
    def basename(self) -> str:
        return posixpath.basename(self.url.rstrip("/"))

    @property
    def where(self) -> str:
        """Which input this is, without credentials: the URL, plus the row group if split."""
        url = public_url(self.url)
        return url if self.row_group is None else f"{url}#row_group={self.row_group}"

    @property
    def part_id(self) -> str:
        """The identity of this shard's output part: stable while other inputs come and go."""
        return hashlib.sha256(self.where.encode("utf-8")).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict, for Celery messages (``part`` is informative; from_dict ignores it)."""
        return {**dataclasses.asdict(self), "part": self.part_id}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShardRef:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def detect_format(url: str, declared: str | None = None) -> tuple[str, str | None]:
    """(format, compression) from the file name; `declared` overrides the format, not the compression."""
    name = posixpath.basename(url.split("?", 1)[0].rstrip("/")).lower()
    stem, ext = posixpath.splitext(name)
    compression = _COMPRESSIONS.get(ext)
    if compression:
        stem, ext = posixpath.splitext(stem)
    if declared is not None:
        fmt = _DECLARED.get(declared.lower())
        if fmt is None:
            raise ValueError(f"unknown input format {declared!r}: expected one of jsonl, parquet, csv")
    else:
        fmt = _FORMATS.get(ext)
        if fmt is None:
            raise ValueError(
                f"cannot tell the format of {url}: expected a name ending in "
                ".jsonl, .ndjson, .parquet, .pq or .csv (optionally followed by .gz, .zst or .zstd), "
                "or declare the format explicitly"
            )
    if fmt == "parquet" and compression:
        raise ValueError(
            f"{url}: a {compression}-compressed parquet file cannot be read in place; "
            "parquet compresses internally"
        )
    return fmt, compression


def _fingerprint(info: dict[str, Any]) -> str:
    """'size:etag-or-mtime' of the object's content, so a rewritten object gets a new fingerprint."""
    size = info.get("size", info.get("Size", ""))
    tag = info.get("ETag") or info.get("etag") or info.get("md5Hash")
    if tag:
        return f"{size}:{str(tag).strip(chr(34))}"
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if value is not None:
            if isinstance(value, datetime):
                value = value.isoformat()
            return f"{size}:{value}"
    return f"{size}:"


def _is_hidden(relative: str) -> bool:
    """Names starting with '_' or '.' (markers, temp dirs, checksums) are not input."""
    return any(part.startswith(("_", ".")) for part in relative.split("/") if part)


def _glob_root(path: str) -> str:
    """The directory part of a glob before its first wildcard."""
    cut = min((i for i, c in enumerate(path) if c in _GLOB_CHARS), default=len(path))
    return path[:cut].rsplit("/", 1)[0]


def _list_files(fs: fsspec.AbstractFileSystem, path: str, url: str) -> tuple[dict[str, dict], bool, str]:
    """{path: info} of candidate files, whether they came from a listing, and the listing root."""
    if any(c in path for c in _GLOB_CHARS):
        found = with_retries(lambda: fs.glob(path, detail=True), what=f"glob {url}")
        files = {p: i for p, i in found.items() if i.get("type") == "file"}
        return files, True, _glob_root(path)
    try:
        info = with_retries(lambda: fs.info(path), what=f"stat {url}")
    except FileNotFoundError:
        return {}, True, path
    except PermissionError as exc:
        raise StorageError(f"access denied listing {url}: {exc}", url) from exc
    if info.get("type") == "directory":
        found = with_retries(lambda: fs.find(path, detail=True), what=f"list {url}")
        files = {p: i for p, i in found.items() if i.get("type", "file") == "file"}
        return files, True, path
    return {path: info}, False, posixpath.dirname(path)


def list_shards(
    input_url: str,
    *,
    format: str | None = None,
    storage_options: dict | None = None,
    split_row_groups: bool = False,
) -> list[ShardRef]:
    """Shards for a single file, a glob, or every known-format file under a prefix, sorted by URL.

    With `format` declared, listed files of an unrecognised extension are taken as
    that format (files whose extension names another format are still skipped).
    """
    if format is not None and format.lower() not in _DECLARED:
        raise ValueError(f"unknown input format {format!r}: expected one of jsonl, parquet, csv")
    fs, path = filesystem_for(input_url, storage_options)
    path = path.rstrip("/") or path
    fs.invalidate_cache()  # other workers/jobs may have written since we last listed
    files, listed, root = _list_files(fs, path, input_url)

    entries: list[tuple[str, str, str, str | None, dict]] = []
    skipped: list[str] = []
    for file_path, info in files.items():
        if listed and _is_hidden(file_path[len(root) :]):
            continue
        url = fs.unstrip_protocol(file_path)
        if listed and url.startswith(("http://", "https://")) and not stays_under(url, fs.unstrip_protocol(root)):
            log.warning("skipping %s: a link out of the listed folder %s", url, root)
            continue
        if not listed:
            fmt, compression = detect_format(url, format)  # explicit file: unknown format is an error
        else:
            try:
                fmt, compression = detect_format(url, format)
                if format is not None and _known_other_format(url, fmt):
                    skipped.append(url)
                    continue
            except ValueError:
                skipped.append(url)
                continue
        entries.append((url, file_path, fmt, compression, info))

    if not entries:
        hint = (
            f" ({len(skipped)} files of other or unknown formats skipped, e.g. {sorted(skipped)[0]})"
            if skipped
            else ""
        )
        raise StorageError(f"no input files match {input_url}{hint}", input_url)

    shards: list[ShardRef] = []
    for url, file_path, fmt, compression, info in sorted(entries, key=lambda e: e[0]):
        content = _fingerprint(info)
        groups = _row_groups(fs, file_path, url) if split_row_groups and fmt == "parquet" else 1
        for row_group in range(groups) if groups > 1 else [None]:
            # Which input a part came from, not only what it held: two files with the same size
            # and mtime (a `cp -p`), or a whole file vs its first row group, must not match.
            ref = ShardRef(len(shards), url, fmt, compression, row_group)
            shards.append(dataclasses.replace(ref, fingerprint=f"{content}@{ref.where}"))
    return shards


def _known_other_format(url: str, declared_fmt: str) -> bool:
    try:
        fmt, _ = detect_format(url)
    except ValueError:
        return False
    return fmt != declared_fmt


def _row_groups(fs: fsspec.AbstractFileSystem, path: str, url: str) -> int:
    """Number of row groups, from the parquet footer only.

    A footer that cannot be read makes the file one whole-file shard, so the
    failure surfaces as that shard's ShardReadError instead of failing the listing.
    """

    def read() -> int:
        with fs.open(path, "rb") as f:
            return pq.ParquetFile(f).metadata.num_row_groups

    try:
        return with_retries(read, what=f"read parquet footer of {url}")
    except Exception as exc:
        if is_transient(exc):
            raise
        log.warning("cannot read parquet footer of %s, keeping it as one shard: %s", url, exc)
        return 1
