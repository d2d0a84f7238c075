"""Counts that add up (issue 41, point 4): after a run stopped mid-shard, ``tokenmill status
SPEC`` shows the checkpointed rows; the re-run's summary says how many rows it computed and
where the others came from, and its tokens/s counts only the tokens it generated. Tiny model,
local and moto."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from pipeline_support import Where, jsonl_bytes, make_plan

from jobs.console import run_summary
from pipeline.fleet import job_status
from pipeline.job_runner import run_embedded
from pipeline.manifest import build_manifest
from pipeline.shard_outcome import ShardOutcome
from pipeline.stop_signals import RunInterrupted

ROWS, MAX_TOKENS = 48, 4


def test_status_and_summary_count_checkpointed_resumed_and_computed_rows(where: Where, tiny_model_dir: Path) -> None:
    where.put("docs.jsonl", jsonl_bytes([{"id": f"d{i}", "text": f"text {i}", "lang": "en"} for i in range(ROWS)]))
    plan = make_plan(where.input_url, where.output_url, tiny_model_dir, storage_options=where.options,
                     checkpoint_rows=10_000, checkpoint_seconds=3600.0,
                     sampling={"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True})

    def stop_at_16(p: ShardOutcome) -> None:
        if p.counts.rows >= 16:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(RunInterrupted):
        run_embedded(plan, progress=False, on_progress=stop_at_16)
    state = job_status(plan)  # what `tokenmill status SPEC` prints
    (shard,) = state["shards"]
    saved = shard["rows_done"]
    assert 16 <= saved < ROWS
    assert state["status"] == "incomplete" and state["progress"]["rows_done"] == saved
    assert shard["state"] == "queued" and shard["reason"] == f"{saved} rows checkpointed (a re-run resumes after them)"

    manifest = run_embedded(plan, progress=False)
    totals, stats = manifest["totals"], manifest["engine_stats"]
    computed = ROWS - saved
    assert (totals["rows"], totals["rows_computed"], totals["rows_resumed"]) == (ROWS, computed, saved)
    assert totals["rows_reused"] == totals["rows_shared"] == totals["rows_current"] == 0
    assert totals["output_tokens"] == ROWS * MAX_TOKENS  # every row's tokens are in the output ...
    assert stats["decode_tokens"] == computed * MAX_TOKENS  # ... but only these were generated now
    # tokens/s over the computed tokens: elapsed_s is rounded to 1 ms, so bound it both ways (a run
    # of 50 ms is 1% off by rounding alone)
    low, high = (computed * MAX_TOKENS / (stats["elapsed_s"] + d) for d in (0.0005, -0.0005))
    assert low - 0.01 <= stats["output_tokens_per_s"] <= high + 0.01
    (entry,) = manifest["shards"]
    assert entry["output_tokens_computed"] == computed * MAX_TOKENS
    # a fleet job's finalizer has no engine count: its tokens/s comes from the shards' results
    fleet = build_manifest(plan, [ShardOutcome.from_result_dict(entry)], mode="celery", started_at="", elapsed_s=2.0)
    assert fleet["engine_stats"]["output_tokens_per_s"] == computed * MAX_TOKENS / 2
    table = run_summary(manifest)
    values = dict(zip(table.columns[0]._cells, table.columns[1]._cells, strict=True))
    assert values["rows"] == (f"{ROWS} ({computed} computed, {saved} resumed from a checkpoint, 0 reused from the "
                              "previous run's parts, 0 shared with an identical row, 0 in parts already current)")

    again = run_embedded(plan, progress=False)  # every part current: nothing computed, no speed
    assert again["totals"]["rows_current"] == ROWS and again["totals"]["rows_computed"] == 0
    assert again["engine_stats"]["output_tokens_per_s"] == 0.0
