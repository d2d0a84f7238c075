"""One ``output.jsonl`` of OpenAI batch output lines, joined from the job's per-part files.

The pipeline has each part's lines written next to it (``connectors.part_lines``: parts
are written by different workers and must stay idempotent); the OpenAI batch API hands
back one file. The join runs in the job's summary stage, which both the embedded runner
and the fleet's finalizer call once every part is written. It takes the parts of this job's done and
skipped shards (``pipeline.summary.OUTPUT_KEY``), never whatever ``part-*.jsonl`` the
folder holds: a part left from an input that is gone must not add its lines.
"""

from __future__ import annotations

import json
from typing import Any

from connectors import merge_part_lines
from pipeline.summary import OUTPUT_KEY

OUTPUT_NAME = "output.jsonl"
OPTIONS_KEY = "openai_output"


def merge_options() -> dict[str, Any]:
    """The kind option asking for the join (the output's location comes with the summary call)."""
    return {OPTIONS_KEY: True}


def merge_requested(options: dict[str, Any]) -> bool:
    return bool(options.get(OPTIONS_KEY))


def _is_error(line: bytes) -> bool:
    return json.loads(line).get("error") is not None


def merge_lines(output_url: str, parts: list[str], storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Concatenate the ``part-<id>.jsonl`` of ``parts``, in that order, into ``output.jsonl``;
    counts ok/error lines."""
    merged = merge_part_lines(output_url, parts, OUTPUT_NAME, storage_options, mark=_is_error)
    return {"url": merged.url, "lines": merged.lines, "errors": merged.marked}


def merge_if_requested(options: dict[str, Any]) -> dict[str, Any] | None:
    output = options.get(OUTPUT_KEY)
    if not merge_requested(options) or not output:
        return None
    return merge_lines(output["url"], output["parts"], output.get("storage_options"))


def merge_summary(table: Any, options: dict[str, Any]) -> dict[str, Any]:
    """Summary stage of kinds without their own: just the join (and its counts)."""
    return {"openai_output": merge_if_requested(options)}
