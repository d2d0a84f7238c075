"""The worker's engine thread: shard tasks from several threads feed one engine, and the
next shard is admitted while the previous one still decodes (fleet cross-shard feeding)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
from pipeline_support import local_put, make_plan, write_uniform_shards

from connectors import list_shards, read_parts
from pipeline.engine_thread import EngineThread, _PlanFeed, _ShardTask
from pipeline.shard_driver import ShardDriver
from pipeline.shard_outcome import ShardOutcome


def _events(log: list[tuple[int, str]]):
    def record(p: ShardOutcome) -> None:
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
    thread = EngineThread(cross_shard=cross_shard)
    log: list[tuple[int, str]] = []
    futures = [thread.submit(plan, shard, on_progress=_events(log)) for shard in list_shards(plan.input_url)]
    thread.start()  # all three tasks are waiting, as under a worker's thread pool
    results = [f.result(timeout=300) for f in futures]

    assert [(r.state, r.counts.rows) for r in results] == [("done", 5)] * 3
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
                       job_id="svc-broken", engine_settings={"model": str(tmp_path / "no-such-model")})

    thread = EngineThread()
    (plan_a, shards_a, ids_a), (plan_b, shards_b, ids_b) = runs["a"], runs["b"]
    order = [(plan_a, shards_a[0]), (plan_b, shards_b[0]), (broken, shards_a[0]), (plan_a, shards_a[1]),
             (plan_b, shards_b[1])]
    broken_events: list[tuple[int, str]] = []
    futures = [thread.submit(plan, shard, on_progress=_events(broken_events) if plan is broken else None)
               for plan, shard in order]
    thread.start()
    results = [f.result(timeout=300) for f in futures]

    assert [r.state for r in results] == ["done", "done", "failed", "done", "done"]
    assert results[2].reason.startswith("cannot process: ")
    assert broken_events == [(0, "failed")]  # its state is reported, it does not stay "running"
    assert sorted(read_parts(plan_a.output_url).column("id").to_pylist()) == sorted(ids_a)
    assert sorted(read_parts(plan_b.output_url).column("id").to_pylist()) == sorted(ids_b)


def test_a_duplicate_delivery_waits_for_the_first_copy_and_is_skipped(tmp_path: Path, tiny_model_dir) -> None:
    inp, out = tmp_path / "in", tmp_path / "out"
    ids = write_uniform_shards(local_put(inp), count=1, rows=4)
    plan = make_plan(str(inp), str(out), tiny_model_dir, job_id="svc-dup")
    (shard,) = list_shards(plan.input_url)
    thread = EngineThread()
    futures = [thread.submit(plan, shard), thread.submit(plan, shard)]
    thread.start()
    first, second = (f.result(timeout=300) for f in futures)
    assert (first.state, second.state) == ("done", "skipped")
    assert second.counts.rows == first.counts.rows == 4
    assert sorted(read_parts(plan.output_url).column("id").to_pylist()) == sorted(ids)


def test_a_run_that_dies_fails_its_shards_and_the_engine_thread_keeps_serving(
    tmp_path: Path, tiny_model_dir, monkeypatch
) -> None:
    """Even a BaseException (a hook calling sys.exit) must not kill the engine thread: every
    shard task of the worker would wait forever."""
    inp, out = tmp_path / "in", tmp_path / "out"
    write_uniform_shards(local_put(inp), count=2, rows=3)
    plan = make_plan(str(inp), str(out), tiny_model_dir, job_id="svc-exit")
    first, second = list_shards(plan.input_url)
    real_step = ShardDriver._step
    exits = []

    def step_once_exits(self) -> None:
        if not exits:
            exits.append(1)
            raise SystemExit("hook called exit")
        real_step(self)

    monkeypatch.setattr(ShardDriver, "_step", step_once_exits)
    thread = EngineThread()
    failed = thread.submit(plan, first)
    thread.start()
    assert failed.result(timeout=300).reason == "cannot process: SystemExit: hook called exit"
    later = thread.submit(plan, second)
    assert later.result(timeout=300).state == "done"


def test_cancel_is_asked_through_any_task_of_the_run() -> None:
    feed = _PlanFeed(EngineThread(), "k")

    def task(index: int, should_stop) -> _ShardTask:
        shard = types.SimpleNamespace(index=index)
        return _ShardTask(None, "k", shard, None, should_stop, "w", None)  # type: ignore[arg-type]

    feed.adopt([task(0, None)])
    assert feed.should_stop() is False  # nobody can ask: carry on
    feed.adopt([task(1, lambda: True)])
    assert feed.should_stop() is True
    assert feed.holds(1) and feed.finish(1) is not None and not feed.holds(1)
