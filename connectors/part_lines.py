"""JSON lines beside the Parquet parts (``part-<id>.jsonl``), and their merge into one file.

A job that also hands back line-oriented output (OpenAI batch output) writes one such file
per part, with the part: parts are written by different workers and a re-processed shard
must rewrite its own file, not append to a shared one. When the job is complete its
summary merges the files of the parts it names, in that order, into one file of the
output folder; a line file left by an input that is gone is never merged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from connectors.atomic import atomic_write
from connectors.manifest import write_text
from connectors.parquet_sink import PartId, part_name
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


def write_part_lines(
    output_url: str, part: PartId, lines: list[dict[str, Any]], storage_options: dict | None = None
) -> str:
    """The part's line file, one JSON object per line (atomically replaced); returns its URL."""
    url = part_lines_url(output_url, part)
    text = "".join(json.dumps(line, ensure_ascii=False, default=str) + "\n" for line in lines)
    write_text(url, text, storage_options)
    return url


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
    paths = [filesystem_for(part_lines_url(output_url, p), storage_options)[1] for p in parts]
    target = join_url(output_url, target_name)
    _, target_path = filesystem_for(target, storage_options)
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
