"""Embedded mode on local files with the tiny model: rows in == rows out, parts, manifest,
hooks, engine faults, cross-shard feeding, truncation and OpenAI batch output."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pipeline_support import (
    expected_ids,
    local_put,
    make_plan,
    tiny_engine,
    write_mixed_inputs,
    write_uniform_shards,
)

from connectors import list_shards, read_manifest, read_parts, success_marker_exists
from jobs.kinds.base import KINDS, JobKind
from pipeline.job_runner import run_embedded
from pipeline.kind_stages import Stage
from pipeline.plan import JobPlan


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "in").mkdir()
    return tmp_path / "in", tmp_path / "out"


def test_three_formats_with_bad_rows(dirs, tiny_model_dir) -> None:
    inp, out = dirs
    files = write_mixed_inputs(local_put(inp))
    plan = make_plan(inp.as_uri(), out.as_uri(), tiny_model_dir)
    manifest = run_embedded(plan, progress=False)

    table = read_parts(plan.output_url)
    ids = table.column("id").to_pylist()
    assert sorted(ids) == sorted(expected_ids(files))  # rows in == rows out, ids kept
    assert len(set(ids)) == len(ids)
    rows = {r["id"]: r for r in table.to_pylist()}
    errors = {i: r["error"] for i, r in rows.items() if r["error"]}
    assert set(errors) == {"a.jsonl:6", "j-empty", "j-notext", "j-nolang", "c-short"}
    assert "malformed JSON" in errors["a.jsonl:6"]
    assert "empty document" in errors["j-empty"]
    assert "missing text field 'text'" in errors["j-notext"]
    assert errors["j-nolang"] == "row 9: template field 'lang' missing"
    assert "expected 3 columns" in errors["c-short"]
    for r in rows.values():
        if not r["error"]:
            assert r["output_tokens"] == 4 and r["finish_reason"] == "length" and r["prompt_tokens"] > 0
    assert rows["c0"]["lang"] == "fr"

    # one part per shard, rows in input order inside each part
    for shard in list_shards(plan.input_url):
        part = pq.read_table(out / f"part-{shard.part_id}.parquet")
        name = shard.url.rsplit("/", 1)[1]
        assert part.column("id").to_pylist() == expected_ids({name: files[name]})

    assert manifest["status"] == "succeeded"
    assert manifest["totals"]["rows"] == len(ids) and manifest["totals"]["errors"] == 5
    assert [s["status"] for s in manifest["shards"]] == ["done"] * 3
    assert manifest["engine_stats"]["prefix_cache_hit_tokens"] > 0  # the shared instruction prefix
    assert read_manifest(plan.output_url) == manifest
    assert success_marker_exists(plan.output_url)
    assert "storage_options" not in json.dumps(manifest)

    # a re-run skips every current part and still reports the counts
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.glob("part-*.parquet")}
    again = run_embedded(plan, progress=False)
    assert [s["status"] for s in again["shards"]] == ["skipped"] * 3
    assert again["totals"]["rows"] == manifest["totals"]["rows"]
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("part-*.parquet")} == mtimes

    # the same input under another sampling budget is new work, not a current part
    longer = make_plan(inp.as_uri(), out.as_uri(), tiny_model_dir,
                       sampling={"max_tokens": 5, "temperature": 0.0, "ignore_eos": True})
    redone = run_embedded(longer, progress=False)
    assert [s["status"] for s in redone["shards"]] == ["done"] * 3
    assert {r["output_tokens"] for r in read_parts(plan.output_url).to_pylist() if not r["error"]} == {5}


def test_unreadable_shard_fails_alone(dirs, tiny_model_dir) -> None:
    inp, out = dirs
    ids = write_uniform_shards(local_put(inp), count=2, rows=3)
    (inp / "broken.parquet").write_bytes(b"this is not parquet at all")
    plan = make_plan(str(inp), str(out), tiny_model_dir)
    manifest = run_embedded(plan, progress=False)
    by_name = {s["url"].rsplit("/", 1)[1]: s for s in manifest["shards"]}
    assert by_name["broken.parquet"]["status"] == "failed"
    assert "cannot read shard" in by_name["broken.parquet"]["reason"]
    assert manifest["status"] == "completed_with_errors"
    assert not success_marker_exists(plan.output_url)
    assert by_name["broken.parquet"]["part_file"] and not (out / by_name["broken.parquet"]["part_file"]).exists()
    assert by_name["broken.parquet"]["part_file"] == f"part-{by_name['broken.parquet']['part']}.parquet"
    assert sorted(read_parts(plan.output_url).column("id").to_pylist()) == sorted(ids)


@pytest.fixture
def scored_kind():
    """A throwaway job kind with a row and a summary step, registered in this process only."""
    calls: list[str] = []

    def score(row, fields, options):
        calls.append(row["id"])
        if row["id"] == "s0-r1":
            raise RuntimeError("scorer exploded")
        return {"score": float(len(row["output"] or "")) * options["scale"], "ok": row["error"] is None,
                "ignored": "not a declared column"}

    def summarize(table, options):
        return {"rows": table.num_rows, "mean_score": sum(x or 0 for x in table.column("score").to_pylist())}

    class Scored(JobKind):
        name = "_test_scored"

        def row_stage(self, plan: JobPlan) -> Stage:
            return Stage("jobs._test_pipeline_hooks:score", score)

        def summary_stage(self, plan: JobPlan) -> Stage:
            return Stage("jobs._test_pipeline_hooks:summarize", summarize)

    yield calls
    del KINDS[Scored.name]


def test_row_step_extra_columns_and_summary(dirs, tiny_model_dir, scored_kind) -> None:
    inp, out = dirs
    ids = write_uniform_shards(local_put(inp), count=2, rows=3)
    plan = make_plan(
        str(inp), str(out), tiny_model_dir, kind="_test_scored", stage_options={"scale": 2.0},
        extra_columns={"score": "float64", "ok": "bool"},
    )
    manifest = run_embedded(plan, progress=False)
    table = read_parts(plan.output_url)
    assert sorted(table.column("id").to_pylist()) == sorted(ids) == sorted(scored_kind)
    rows = {r["id"]: r for r in table.to_pylist()}
    assert "ignored" not in table.column_names
    assert rows["s0-r1"]["error"].startswith("row 1: row hook jobs._test_pipeline_hooks:score failed: RuntimeError")
    assert rows["s0-r1"]["score"] is None
    assert rows["s1-r0"]["ok"] is True and rows["s1-r0"]["score"] > 0
    assert manifest["summary"]["rows"] == len(ids)
    assert manifest["totals"]["errors"] == 1


def test_truncate_prompt(dirs, tiny_model_dir) -> None:
    inp, out = dirs
    long_text = " ".join(f"word{i}" for i in range(400))
    local_put(inp)("long.jsonl", (json.dumps({"id": "long", "text": long_text, "lang": "en"}) + "\n").encode())
    engine = tiny_engine(tiny_model_dir, max_model_len=256)
    strict = make_plan(str(inp), str(out / "strict"), tiny_model_dir, engine_settings=engine)
    run_embedded(strict, progress=False)
    (row,) = read_parts(strict.output_url).to_pylist()
    assert row["error"].startswith("row 0: prompt is") and "context is 256 tokens" in row["error"]

    cut = make_plan(str(inp), str(out / "cut"), tiny_model_dir, engine_settings=engine, truncate_prompt=True)
    run_embedded(cut, progress=False)
    (row,) = read_parts(cut.output_url).to_pylist()
    assert row["error"] is None and 128 <= row["prompt_tokens"] < 256 and row["output_tokens"] == 4


def test_openai_output_lines(dirs, tiny_model_dir) -> None:
    inp, out = dirs
    files = write_mixed_inputs(local_put(inp), n=2)
    plan = make_plan(str(inp), str(out), tiny_model_dir, openai_output=True)
    run_embedded(plan, progress=False)
    parts = [f"part-{s.part_id}.jsonl" for s in list_shards(plan.input_url)]
    lines = [json.loads(x) for p in parts for x in (out / p).read_text().splitlines()]
    assert [x["custom_id"] for x in lines] == expected_ids(files)
    ok = next(x for x in lines if x["custom_id"] == "j0")
    body = ok["response"]["body"]
    assert ok["error"] is None and ok["response"]["status_code"] == 200
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 4
    bad = next(x for x in lines if x["custom_id"] == "j-empty")
    assert bad["response"] is None and "empty document" in bad["error"]["message"]


def test_cancel_stops_embedded_run(dirs, tiny_model_dir) -> None:
    inp, out = dirs
    write_uniform_shards(local_put(inp), count=3, rows=4)
    plan = make_plan(str(inp), str(out), tiny_model_dir)
    manifest = run_embedded(plan, progress=False, should_stop=lambda: True)
    assert manifest["status"] == "cancelled"
    assert {s["status"] for s in manifest["shards"]} == {"cancelled"}
    assert not success_marker_exists(plan.output_url)
    assert not list(out.glob("part-*.parquet"))


def test_progress_does_not_count_skipped_shards_as_speed() -> None:
    from pipeline.progress import RunProgress
    from pipeline.shard_outcome import ShardCounts, ShardOutcome, ShardState

    class IdleEngine:
        def stats(self) -> dict:
            return {"kv_blocks_used_now": 0, "kv_blocks_total": 10}

    progress = RunProgress(2, IdleEngine(), enabled=False)
    progress(ShardOutcome(0, "a", ShardState.SKIPPED, ShardCounts(rows=10, output_tokens=500_000)))
    info = progress.bar.tasks[0].fields["info"]
    assert info == "1/2 shards · 10 rows already done · 0 tok/s · KV 0%"
    assert progress.bar.tasks[0].completed == 10  # rows (issue 41): one large file moves the bar too


def test_progress_counts_rows_of_a_running_shard_and_only_generated_tokens() -> None:
    from pipeline.progress import RunProgress
    from pipeline.shard_outcome import ShardCounts, ShardOutcome, ShardState

    class Engine:
        decode_tokens = 100

        def stats(self) -> dict:
            return {"kv_blocks_used_now": 5, "kv_blocks_total": 10, "decode_tokens": self.decode_tokens}

    engine = Engine()
    progress = RunProgress(1, engine, enabled=False)
    engine.decode_tokens = 100  # nothing generated yet: 120 rows resumed from a checkpoint
    progress(ShardOutcome(0, "a", ShardState.RUNNING, ShardCounts(rows=120, output_tokens=9_000), rows_resumed=120))
    task = progress.bar.tasks[0]
    assert task.completed == 120 and task.fields["info"] == "0/1 shards · 0 tok/s · KV 50%"
