"""One ``output.jsonl`` of OpenAI batch output lines, joined from the job's per-part files.

The pipeline writes ``part-<id>.jsonl`` next to each Parquet part (parts are written by
different workers and must stay idempotent); the OpenAI batch API hands back one file.
The join runs in the job's summary hook, which both the embedded runner and the fleet's
finalizer call once every part is written. It takes the parts of this job's done and
skipped shards (``pipeline.summary.OUTPUT_KEY``), never whatever ``part-*.jsonl`` the
folder holds: a part left from an input that is gone must not add its lines.
"""

from __future__ import annotations

import json
from typing import Any

from connectors import filesystem_for, join_url
from connectors.atomic import atomic_write
from pipeline.openai_output import jsonl_name
from pipeline.summary import OUTPUT_KEY

OUTPUT_NAME = "output.jsonl"
OPTIONS_KEY = "openai_output"


def merge_options() -> dict[str, Any]:
    """The hook option asking for the join (the output's location comes with the summary call)."""
    return {OPTIONS_KEY: True}


def merge_lines(output_url: str, parts: list[str], storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Concatenate the ``part-<id>.jsonl`` of ``parts``, in that order, into ``output.jsonl``;
    counts ok/error lines."""
    fs, base = filesystem_for(output_url, storage_options)
    fs.invalidate_cache()
    paths = [filesystem_for(join_url(output_url, jsonl_name(p)), storage_options)[1] for p in parts]
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
    output = options.get(OUTPUT_KEY)
    if not options.get(OPTIONS_KEY) or not output:
        return None
    return merge_lines(output["url"], output["parts"], output.get("storage_options"))


def merge_summary(table: Any, options: dict[str, Any]) -> dict[str, Any]:
    """Summary hook of kinds without their own: just the join (and its counts)."""
    return {"openai_output": merge_if_requested(options)}
