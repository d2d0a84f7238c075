"""One ``output.jsonl`` of OpenAI batch output lines, joined from the per-part files.

The pipeline writes ``part-NNNNN.jsonl`` next to each Parquet part (parts are written by
different workers and must stay idempotent); the OpenAI batch API hands back one file.
The join runs in the job's summary hook, which both the embedded runner and the fleet's
finalizer call once every part is written.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from connectors import filesystem_for, join_url, with_retries
from connectors.atomic import atomic_write

OUTPUT_NAME = "output.jsonl"
OPTIONS_KEY = "openai_output"


def merge_options(output_url: str, storage_options: dict[str, Any]) -> dict[str, Any]:
    """What the summary hook needs to find the parts (kept in hook_options, never written out)."""
    return {OPTIONS_KEY: {"output_url": output_url, "storage_options": storage_options}}


def merge_lines(output_url: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Concatenate ``part-*.jsonl`` in part order into ``output.jsonl``; counts ok/error lines."""
    fs, base = filesystem_for(output_url, storage_options)
    fs.invalidate_cache()
    paths = sorted(with_retries(lambda: fs.glob(posixpath.join(base.rstrip("/"), "part-*.jsonl")),
                                what=f"list {output_url}"))
    target = join_url(output_url, OUTPUT_NAME)
    _, target_path = filesystem_for(target, storage_options)
    counts = {"lines": 0, "errors": 0}

    def write(out: Any) -> None:
        counts.update(lines=0, errors=0)  # a retried write starts over
        for path in paths:
            with fs.open(path, "rb") as part:
                for line in part:
                    if not line.strip():
                        continue
                    counts["lines"] += 1
                    counts["errors"] += json.loads(line).get("error") is not None
                    out.write(line if line.endswith(b"\n") else line + b"\n")

    atomic_write(fs, target_path, write, what=target)
    return {"url": target, **counts}


def merge_if_requested(options: dict[str, Any]) -> dict[str, Any] | None:
    request = options.get(OPTIONS_KEY)
    if not request:
        return None
    return merge_lines(request["output_url"], request.get("storage_options"))


def merge_summary(table: Any, options: dict[str, Any]) -> dict[str, Any]:
    """Summary hook of kinds without their own: just the join (and its counts)."""
    return {"openai_output": merge_if_requested(options)}
