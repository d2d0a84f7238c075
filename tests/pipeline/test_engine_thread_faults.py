"""The worker's engine thread under faults and shutdown.

- An engine that dies: the shards it held fail with the reason (transiently, so the fleet
  retries them), the engine is rebuilt, and the engine thread keeps serving.
- ``drain`` (SIGTERM): nothing new is taken, held shards may finish within the grace
  period, and what is left then is handed back (``ShardHandedBack``), never reported or
  committed.
"""

from __future__ import annotations

import gc
import threading
import weakref
from pathlib import Path

import pytest
from pipeline_support import local_put, make_plan, write_uniform_shards

from connectors import list_shards, read_parts
from engine import LLMEngine
from pipeline import engine_cache
from pipeline.engine_thread import EngineThread, ShardHandedBack
from pipeline.shard_outcome import ShardOutcome


def test_engine_death_fails_its_shards_rebuilds_and_keeps_serving(tmp_path: Path, tiny_model_dir, monkeypatch) -> None:
    inp, out = tmp_path / "in", tmp_path / "out"
    ids = write_uniform_shards(local_put(inp), count=2, rows=4)
    plan = make_plan(str(inp), str(out), tiny_model_dir, job_id="svc-death")
    first, second = list_shards(plan.input_url)
    engine_cache.clear_engine_cache()  # an engine of this test's own, held by nothing of earlier tests
    engine = engine_cache.get_engine(plan.engine_settings)
    engine.runner.self_cycle = engine.runner  # caught in a reference cycle, as an engine may be
    dead, dead_runner = weakref.ref(engine), weakref.ref(engine.runner)
    del engine
    real_step = LLMEngine.step

    def dying_step(self):
        if self is dead():  # this engine's scheduler state is broken: every step raises
            raise RuntimeError("scheduler state corrupt")
        return real_step(self)

    monkeypatch.setattr(LLMEngine, "step", dying_step)
    thread = EngineThread()
    failed = thread.submit(plan, first, worker="w")
    thread.start()
    result = failed.result(timeout=300)
    assert (result.state, result.reason, result.transient) == (
        "failed", "engine failed: RuntimeError: scheduler state corrupt", True)
    assert not list(out.glob("part-*"))  # nothing committed for the failed shard

    rebuilt = engine_cache.get_engine(plan.engine_settings)
    gc.collect()
    # the broken engine was replaced, not reused, and let go before its successor was frozen
    # out of the collector's reach: nothing of it is left, cycle or not
    assert dead() is None and dead_runner() is None and rebuilt.runner is not None
    later = [thread.submit(plan, shard) for shard in (first, second)]  # the retry, and a new shard
    assert [f.result(timeout=300).state for f in later] == ["done", "done"]
    out_ids = read_parts(plan.output_url).column("id").to_pylist()
    assert sorted(out_ids) == sorted(ids) and len(out_ids) == len(set(out_ids))


class _Events(list):
    def __init__(self, when, seen: threading.Event) -> None:
        super().__init__()
        self.when, self.seen = when, seen

    def append(self, event: ShardOutcome) -> None:
        super().append(event)
        if event.state == "running" and self.when(self):
            self.seen.set()


def _recorder(when) -> tuple[_Events, threading.Event]:
    """Progress events, and an Event set at the first running event after which ``when(events)`` holds."""
    seen = threading.Event()
    return _Events(when, seen), seen


def _long_plan(tmp_path: Path, model_dir: Path, tag: str, rows: int):
    inp = tmp_path / tag / "in"
    ids = write_uniform_shards(local_put(inp), count=3, rows=rows)
    plan = make_plan(str(inp), str(tmp_path / tag / "out"), model_dir, job_id=f"svc-{tag}",
                     sampling={"max_tokens": 32, "temperature": 0.0, "ignore_eos": True})
    return plan, list_shards(plan.input_url), ids


def test_drain_hands_back_open_shards_when_the_grace_period_is_over(tmp_path: Path, tiny_model_dir) -> None:
    # Long enough to outlast the driver's stop check (once a second) on any machine: 200 rows
    # finished within that second on an AMD EPYC (Zen 5) and the shard was reported done.
    plan, shards, _ = _long_plan(tmp_path, tiny_model_dir, "drain0", rows=2000)
    events, mid_shard = _recorder(lambda events: any(e.counts.rows > 0 for e in events))
    thread = EngineThread()
    futures = [thread.submit(plan, shard, on_progress=events.append) for shard in shards[:2]]
    thread.start()
    assert mid_shard.wait(120)
    thread.drain(0.0)
    for future in futures:
        with pytest.raises(ShardHandedBack, match="worker shutting down"):
            future.result(timeout=120)
    with pytest.raises(ShardHandedBack, match="not started"):  # nothing new is taken
        thread.submit(plan, shards[2]).result(timeout=5)
    assert not list(Path(plan.output_url).glob("part-*"))  # nothing committed
    # (the second shard was still queued behind the first, unread: handed back as "not started")
    assert not [e for e in events if e.state not in ("running",)]  # never reported cancelled or done


def test_drain_lets_held_shards_finish_within_the_grace_period(tmp_path: Path, tiny_model_dir) -> None:
    plan, shards, ids = _long_plan(tmp_path, tiny_model_dir, "drain-grace", rows=6)
    events, opened = _recorder(lambda events: {e.index for e in events} == {0, 1})  # both open
    thread = EngineThread()
    futures = [thread.submit(plan, shard, on_progress=events.append) for shard in shards[:2]]
    thread.start()
    assert opened.wait(120)
    thread.drain(600.0)
    assert [f.result(timeout=300).state for f in futures] == ["done", "done"]
    with pytest.raises(ShardHandedBack):
        thread.submit(plan, shards[2]).result(timeout=5)
    assert sorted(read_parts(plan.output_url).column("id").to_pylist()) == sorted(ids[:12])


def test_grace_period_option_reaches_the_shutdown_handler(monkeypatch) -> None:
    """``tokenmill worker --grace-period 7``: SIGTERM (warm) drains with 7 s, SIGQUIT (cold) with 0."""
    from typer.testing import CliRunner

    from cli.app import app as cli
    from pipeline import celery_app, engine_thread, worker

    monkeypatch.delenv("TOKENMILL_GRACE_PERIOD", raising=False)
    assert celery_app.grace_period_s() == 30.0
    monkeypatch.setattr(worker.app, "worker_main", lambda argv: None)  # do not start a worker
    result = CliRunner().invoke(cli, ["worker", "--grace-period", "7"])
    assert result.exit_code == 0, result.output
    assert celery_app.grace_period_s() == 7.0

    drained: list[float] = []

    class _FakeEngineThread:
        def drain(self, grace_s: float) -> None:
            drained.append(grace_s)

    monkeypatch.setattr(engine_thread, "engine_thread", _FakeEngineThread)
    celery_app._drain_on_shutdown(sig="SIGTERM", how="Warm")
    celery_app._drain_on_shutdown(sig="SIGQUIT", how="Cold")
    assert drained == [7.0, 0.0]
