"""The worker's engine service: shard tasks from several threads feed one engine, and the
next shard is admitted while the previous one still decodes (fleet cross-shard feeding)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pipeline_support import local_put, make_plan, write_uniform_shards

from connectors import list_shards, read_parts
from pipeline.engine_service import EngineService
from pipeline.shard_processor import ShardProgress


def _events(log: list[tuple[int, str]]):
    def record(p: ShardProgress) -> None:
        if not log or log[-1] != (p.index, p.state):
            log.append((p.index, p.state))

    return record


def _first(log: list[tuple[int, str]], event: tuple[int, str]) -> int:
    return log.index(event)


@pytest.mark.parametrize("cross_shard", [True, False])
def test_next_shard_is_admitted_while_the_previous_one_decodes(tmp_path: Path, tiny_model_dir, cross_shard) -> None:
    inp, out = tmp_path / "in", tmp_path / "out"
    ids = write_uniform_shards(local_put(inp), count=3, rows=5)
    plan = make_plan(str(inp), str(out), tiny_model_dir, job_id=f"svc-{cross_shard}",
                     sampling={"max_tokens": 8, "temperature": 0.0, "ignore_eos": True})
    service = EngineService(cross_shard=cross_shard)
    log: list[tuple[int, str]] = []
    futures = [service.submit(plan, shard, on_progress=_events(log)) for shard in list_shards(plan.input_url)]
    service.start()  # all three tasks are waiting, as under a worker's thread pool
    results = [f.result(timeout=300) for f in futures]

    assert [(r["status"], r["rows"]) for r in results] == [("done", 5)] * 3
    assert sorted(read_parts(plan.output_url).column("id").to_pylist()) == sorted(ids)
    for shard in (1, 2):
        opened, previous_done = _first(log, (shard, "running")), _first(log, (shard - 1, "done"))
        # cross-shard: opened before the previous shard's rows (8 decode steps each) finish
        assert (opened < previous_done) is cross_shard, log


def test_plans_take_turns_and_a_broken_plan_fails_only_its_shards(tmp_path: Path, tiny_model_dir) -> None:
    runs = {}
    for name in ("a", "b"):
        inp = tmp_path / name / "in"
        ids = write_uniform_shards(local_put(inp), count=2, rows=3, prefix=f"{name}-")
        plan = make_plan(str(inp), str(tmp_path / name / "out"), tiny_model_dir, job_id=f"svc-{name}")
        runs[name] = (plan, list_shards(plan.input_url), ids)
    broken = make_plan(str(tmp_path / "a" / "in"), str(tmp_path / "broken-out"), tiny_model_dir,
                       job_id="svc-broken", engine={"model": str(tmp_path / "no-such-model")})

    service = EngineService()
    (plan_a, shards_a, ids_a), (plan_b, shards_b, ids_b) = runs["a"], runs["b"]
    order = [(plan_a, shards_a[0]), (plan_b, shards_b[0]), (broken, shards_a[0]), (plan_a, shards_a[1]),
             (plan_b, shards_b[1])]
    futures = [service.submit(plan, shard) for plan, shard in order]
    service.start()
    results = [f.result(timeout=300) for f in futures]

    assert [r["status"] for r in results] == ["done", "done", "failed", "done", "done"]
    assert results[2]["reason"].startswith("cannot process: ")
    assert sorted(read_parts(plan_a.output_url).column("id").to_pylist()) == sorted(ids_a)
    assert sorted(read_parts(plan_b.output_url).column("id").to_pylist()) == sorted(ids_b)


def test_a_duplicate_delivery_waits_for_the_first_copy_and_is_skipped(tmp_path: Path, tiny_model_dir) -> None:
    inp, out = tmp_path / "in", tmp_path / "out"
    ids = write_uniform_shards(local_put(inp), count=1, rows=4)
    plan = make_plan(str(inp), str(out), tiny_model_dir, job_id="svc-dup")
    (shard,) = list_shards(plan.input_url)
    service = EngineService()
    futures = [service.submit(plan, shard), service.submit(plan, shard)]
    service.start()
    first, second = (f.result(timeout=300) for f in futures)
    assert (first["status"], second["status"]) == ("done", "skipped")
    assert second["rows"] == first["rows"] == 4
    assert sorted(read_parts(plan.output_url).column("id").to_pylist()) == sorted(ids)
