"""The error budget: a job whose rows mostly failed is ``failed``, not ``succeeded``.

Rows in == rows out, so a bad row becomes an error row and its shard is still ``done``.
That is right for a few bad documents, but a job in which every row erred (a
``text_field`` the input lacks, a broken template, a model that refuses every prompt) must
not write ``_SUCCESS``: a downstream reader would take the errors for results. When the
output's error rows pass the plan's budget (``max_error_fraction`` of its rows, or
``max_error_rows``) the manifest says ``failed`` with an ``error`` that names the
commonest error, no ``_SUCCESS`` is written, and the parts stay for inspection.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

from connectors import iter_part_column
from pipeline.job_status import JobStatus
from pipeline.plan import JobPlan
from pipeline.shard_outcome import entry_has_part, entry_part_id

log = logging.getLogger(__name__)

_ROW_PREFIX = re.compile(r"^row \d+: ")
_NUMBER = re.compile(r"\d+")
EXAMPLE_CHARS = 300  # the summary is one line: a long error is cut
MAX_KINDS = 10_000  # distinct errors counted (figures aside): the count's memory stays bounded


def over_budget(plan: JobPlan, rows: int, errors: int) -> bool:
    """Whether ``errors`` of ``rows`` pass the plan's budget."""
    if plan.max_error_rows is not None and errors > plan.max_error_rows:
        return True
    return rows > 0 and errors / rows > plan.max_error_fraction


def commonest_error(plan: JobPlan, manifest: dict[str, Any]) -> tuple[str, int] | None:
    """The error shared by most rows of the manifest's parts (row numbers and other figures
    aside) with how many rows have it; None if the parts cannot be read."""
    parts = [entry_part_id(e) for e in manifest["shards"] if entry_has_part(e)]
    batches = iter_part_column(plan.output_url, [p for p in parts if p], "error", plan.output_options)
    try:  # a batch at a time: a million error rows are read, not held
        return commonest(error for batch in batches for error in batch)
    except Exception as exc:  # the budget still fails the job; only the example is missing
        log.warning("cannot read the errors of %s: %s", plan.job_id, exc)
        return None


def commonest(errors: Iterable[str | None]) -> tuple[str, int] | None:
    """The error most rows share, row numbers and other figures aside (an example of it on one
    line, at most ``EXAMPLE_CHARS``), and how many rows have it; None if no row erred."""
    counts: Counter[str] = Counter()
    example: dict[str, str] = {}
    for error in errors:
        if error:
            text = " ".join(_ROW_PREFIX.sub("", error).split())  # one line: a traceback's too
            key = _NUMBER.sub("#", text)
            if key not in counts and len(counts) >= MAX_KINDS:
                continue  # as many kinds as this are counted; the commonest is among the first
            counts[key] += 1
            example.setdefault(key, text if len(text) <= EXAMPLE_CHARS else text[:EXAMPLE_CHARS - 3] + "...")
    if not counts:
        return None
    key, count = counts.most_common(1)[0]
    return example[key], count


def apply_error_budget(plan: JobPlan, manifest: dict[str, Any]) -> None:
    """Fail a succeeded (or completed with errors) manifest whose error rows pass the budget."""
    if manifest["status"] not in (JobStatus.SUCCEEDED, JobStatus.COMPLETED_WITH_ERRORS):
        return
    rows, errors = manifest["totals"]["rows"], manifest["totals"]["errors"]
    if not over_budget(plan, rows, errors):
        return
    limit = f"max_error_fraction {plan.max_error_fraction:g}"
    if plan.max_error_rows is not None:
        limit += f", max_error_rows {plan.max_error_rows}"
    message = f"{errors} of {rows} rows failed ({errors / rows:.0%}; over {limit})"
    top = commonest_error(plan, manifest)
    if top is not None:
        message += f"; commonest error ({top[1]} row{'s' if top[1] != 1 else ''}): {top[0]}"
    log.error("job %s failed: %s", plan.job_id, message)
    if manifest.get("error"):  # what publishing found already (stale parts, a replaced part) stays
        message = f"{manifest['error']}; {message}"
    manifest["status"], manifest["success_marker"], manifest["error"] = JobStatus.FAILED.value, False, message
