"""A worker whose engine dies keeps serving: the shards it held fail with the reason
(transiently, so the fleet retries them) and the engine is rebuilt for the next shards."""

from __future__ import annotations

from pathlib import Path

from pipeline_support import local_put, make_plan, write_uniform_shards

from connectors import list_shards, read_parts
from engine import LLMEngine
from pipeline import engine_cache
from pipeline.engine_service import EngineService


def test_engine_death_fails_its_shards_rebuilds_and_keeps_serving(tmp_path: Path, tiny_model_dir, monkeypatch) -> None:
    inp, out = tmp_path / "in", tmp_path / "out"
    ids = write_uniform_shards(local_put(inp), count=2, rows=4)
    plan = make_plan(str(inp), str(out), tiny_model_dir, job_id="svc-death")
    first, second = list_shards(plan.input_url)
    dead = engine_cache.get_engine(plan.engine)
    real_step = LLMEngine.step

    def dying_step(self):
        if self is dead:  # this engine's scheduler state is broken: every step raises
            raise RuntimeError("scheduler state corrupt")
        return real_step(self)

    monkeypatch.setattr(LLMEngine, "step", dying_step)
    service = EngineService()
    failed = service.submit(plan, first, worker="w")
    service.start()
    result = failed.result(timeout=300)
    assert (result["status"], result["reason"], result["transient"]) == (
        "failed", "engine failed: RuntimeError: scheduler state corrupt", True)
    assert not list(out.glob("part-*"))  # nothing committed for the failed shard

    rebuilt = engine_cache.get_engine(plan.engine)
    assert rebuilt is not dead  # the broken engine was replaced, not reused
    assert not dead.has_unfinished()
    later = [service.submit(plan, shard) for shard in (first, second)]  # the retry, and a new shard
    assert [f.result(timeout=300)["status"] for f in later] == ["done", "done"]
    out_ids = read_parts(plan.output_url).column("id").to_pylist()
    assert sorted(out_ids) == sorted(ids) and len(out_ids) == len(set(out_ids))
