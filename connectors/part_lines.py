"""JSON lines beside the Parquet parts (``part-<id>.jsonl``), and their merge into one file.

A job that also hands back line-oriented output (OpenAI batch output) writes one such file
per part, with the part: parts are written by different workers and a re-processed shard
must rewrite its own file, not append to a shared one. When the job is complete its
summary merges the files of the parts it names, in that order, into one file of the
output folder; a line file left by an input that is gone is never merged.

A part's lines are written only after its Parquet part is committed (a part that fails
leaves no new lines behind); the part's footer holds their SHA-256, so a part whose lines
did not follow (the writer died in between) is not current and is written again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from connectors.atomic import atomic_write
from connectors.manifest import read_optional_bytes, write_bytes
from connectors.parquet_sink import LINES_KEY, PartId, part_name, read_part_footer
from connectors.storage import filesystem_for, join_url

LINES_EXT = "jsonl"


@dataclass(frozen=True)
class MergedLines:
    """Where the merged file is, its non-blank lines, and how many of them ``mark`` picked out."""

    url: str
    lines: int
    marked: int


def part_lines_url(output_url: str, part: PartId) -> str:
    """``<output_url>/part-<id>.jsonl``."""
    return join_url(output_url, part_name(part, LINES_EXT))


def encode_part_lines(lines: list[dict[str, Any]]) -> bytes:
    """The line file's bytes: one JSON object per line."""
    return "".join(json.dumps(line, ensure_ascii=False, default=str) + "\n" for line in lines).encode("utf-8")


def lines_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_part_lines(output_url: str, part: PartId, data: bytes, storage_options: dict | None = None) -> str:
    """The part's line file (``encode_part_lines``), atomically replaced; returns its URL."""
    url = part_lines_url(output_url, part)
    write_bytes(url, data, storage_options)
    return url


def part_lines_are_current(output_url: str, part: PartId, storage_options: dict | None = None) -> bool:
    """Whether the part's line file is the one its footer names (its SHA-256)."""
    expected = read_part_footer(output_url, part, storage_options).get(LINES_KEY)
    if expected is None:
        return False
    data = read_optional_bytes(part_lines_url(output_url, part), storage_options)
    return data is not None and lines_sha256(data).encode("ascii") == expected


def read_part_lines(output_url: str, part: PartId, storage_options: dict | None = None) -> list[dict] | None:
    """The part's lines, if its line file is the one its footer names; else None."""
    try:
        expected = read_part_footer(output_url, part, storage_options).get(LINES_KEY)
    except FileNotFoundError:
        return None
    data = read_optional_bytes(part_lines_url(output_url, part), storage_options) if expected else None
    if data is None or lines_sha256(data).encode("ascii") != expected:
        return None
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def merge_part_lines(
    output_url: str,
    parts: list[PartId],
    target_name: str,
    storage_options: dict | None = None,
    *,
    mark: Callable[[bytes], bool] = lambda _line: False,
) -> MergedLines:
    """Concatenate the line files of ``parts``, in that order, into ``<output_url>/<target_name>``
    (atomically; blank lines dropped, each line ending in a newline); ``mark`` is asked about
    every line kept and the lines it says yes to are counted."""
    fs, _ = filesystem_for(output_url, storage_options)
    fs.invalidate_cache()
    paths = [filesystem_for(part_lines_url(output_url, p), storage_options).path for p in parts]
    target = join_url(output_url, target_name)
    target_path = filesystem_for(target, storage_options).path
    counts = {"lines": 0, "marked": 0}

    def write(out: IO[bytes]) -> None:
        counts.update(lines=0, marked=0)  # a retried write starts over
        for path in paths:
            with fs.open(path, "rb") as part:
                for line in part:
                    if not line.strip():
                        continue
                    counts["lines"] += 1
                    counts["marked"] += bool(mark(line))
                    out.write(line if line.endswith(b"\n") else line + b"\n")

    atomic_write(fs, target_path, write, what=target)
    return MergedLines(url=target, lines=counts["lines"], marked=counts["marked"])
