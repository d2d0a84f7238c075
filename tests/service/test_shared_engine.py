"""One engine per server process (issue 43): the live routes' thread and the embedded runner's jobs
step one engine in turn (``pipeline/engine_share.py``), each aborting and hearing of only its own
requests, the live ones first in line. Here with ``LiveEngine`` and ``run_embedded`` in process;
through the ``openai`` client against a server in ``test_service_one_engine.py``."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from pipeline_support import local_put, make_plan, tiny_engine, wait_until, write_uniform_shards

from connectors import read_parts
from engine import SamplingParams
from pipeline.engine_share import EngineReset, EngineShare, same_engine
from pipeline.job_runner import run_embedded
from pipeline.plan import JobPlan
from service.live_engine import LiveEngine, engine_settings

LONG = SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True)
# Each job row's tokens: enough steps that the job is still running while the tests' live calls
# come and go (at 40, on a 2-core Zen 5, the job finished before a live call was answered).
JOB_TOKENS = 160


def _plan(tmp_path: Path, model_dir: Path, name: str) -> JobPlan:
    """4 shards of 8 rows, JOB_TOKENS tokens each: with 8 sequences a step, some 640 steps."""
    inp = tmp_path / "in"
    if not inp.exists():
        write_uniform_shards(local_put(inp), count=4, rows=8, words=6)
    return make_plan(str(inp), str(tmp_path / name), model_dir, job_id=name,
                     sampling={"max_tokens": JOB_TOKENS, "temperature": 0.0, "ignore_eos": True})


def _rows(plan: JobPlan) -> list[dict[str, Any]]:
    """The output rows but their latencies and prefix-cache hits (the second run on an engine
    finds the first one's prompts cached)."""
    table = read_parts(plan.output_url, plan.output_options)
    drop = [c for c in table.column_names if "latency" in c or c == "cached_prompt_tokens"]
    rows = table.drop_columns(drop).to_pylist()
    return sorted(rows, key=lambda r: r["id"])


class _Job:
    """``run_embedded`` of ``plan`` on a thread, on its own side of ``share``."""

    def __init__(self, share: EngineShare, plan: JobPlan) -> None:
        self.view, self.stop, self.manifest = share.view(f"job {plan.job_id}"), threading.Event(), None
        self.thread = threading.Thread(target=self._run, args=(plan,), daemon=True)
        self.thread.start()
        wait_until(lambda: self.view.ids or not self.thread.is_alive(), 120, "the job's rows in the engine")

    def _run(self, plan: JobPlan) -> None:
        self.manifest = run_embedded(plan, progress=False, engine=self.view, engine_factory=lambda: self.view,
                                     should_stop=self.stop.is_set)

    def result(self) -> dict[str, Any]:
        self.thread.join(300)
        assert self.manifest is not None
        return self.manifest


@pytest.fixture
def shared(tiny_model_dir):
    settings = tiny_engine(tiny_model_dir)
    share = EngineShare(settings)
    live = LiveEngine(engine_settings(str(tiny_model_dir), settings), engines=share)
    live.start()
    wait_until(lambda: live.ready or live.load_error, 120, "the live engine")
    return share, live


def test_a_live_call_is_answered_while_the_job_runs_and_the_job_is_token_equal(tmp_path, tiny_model_dir, shared):
    share, live = shared
    solo = _Job(share, _plan(tmp_path, tiny_model_dir, "solo")).result()  # no live traffic
    assert solo["status"] == "succeeded"
    short = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    alone = live.submit([[10, 11, 12]], [short]).result(timeout=120)

    job = _Job(share, _plan(tmp_path, tiny_model_dir, "beside-live"))
    cancelled = live.submit([[20, 21, 22]], [LONG])
    wait_until(lambda: live.engine.ids, 60, "the live requests in the engine", interval=0.005)
    answer = live.submit([[10, 11, 12]], [short]).result(timeout=120)
    assert job.view.ids and job.thread.is_alive()  # answered before the job's last rows finished
    assert [o.token_ids for o in answer] == [o.token_ids for o in alone]
    live.cancel(cancelled)  # its client went away: only its own request leaves the engine
    manifest = job.result()
    assert manifest["status"] == "succeeded" and manifest["totals"]["errors"] == 0
    assert live.aborted == 1
    assert _rows(_plan(tmp_path, tiny_model_dir, "beside-live")) == _rows(_plan(tmp_path, tiny_model_dir, "solo"))
    # the job's counters are its own: the live calls' tokens are not in them
    assert manifest["engine_stats"]["decode_tokens"] == solo["engine_stats"]["decode_tokens"] == 32 * JOB_TOKENS
    assert share.builds == 1


def test_cancelling_the_job_leaves_the_live_requests_running(tmp_path, tiny_model_dir, shared):
    share, live = shared
    job = _Job(share, _plan(tmp_path, tiny_model_dir, "cancelled"))
    call = live.submit([[10, 11, 12], [13, 14]], [LONG] * 2)
    wait_until(lambda: live.engine.ids, 60, "the live requests in the engine", interval=0.005)
    job.stop.set()
    assert job.result()["status"] == "cancelled"
    assert not job.view.ids
    outputs = call.result(timeout=120)
    assert [len(o.token_ids) for o in outputs] == [300, 300] and {o.finish_reason for o in outputs} == {"length"}


def test_a_failed_step_rebuilds_the_engine_and_tells_both_sides(tmp_path, tiny_model_dir, shared):
    share, live = shared
    job = _Job(share, _plan(tmp_path, tiny_model_dir, "fault"))
    call = live.submit([[10, 11, 12]], [LONG])
    wait_until(lambda: live.engine.ids, 60, "the live request in the engine", interval=0.005)
    engine = share.engine
    real_step = engine.step

    def fail_once() -> list:
        engine.step = real_step
        raise RuntimeError("device lost")

    engine.step = fail_once
    with pytest.raises((RuntimeError, EngineReset), match="device lost"):
        call.result(timeout=120)
    manifest = job.result()
    failed = [s for s in manifest["shards"] if s["status"] == "failed"]
    assert failed and all("device lost" in (s["reason"] or "") for s in failed)
    assert share.builds == 2 and share.engine is not engine
    again = live.submit([[10, 11, 12]], [SamplingParams(max_tokens=4, temperature=0.0)]).result(timeout=120)
    assert len(again[0].token_ids) == 4  # the live routes go on with the new engine


def test_jobs_share_the_engine_only_when_their_settings_build_the_same_one(tiny_model_dir):
    settings = tiny_engine(tiny_model_dir)
    assert same_engine({**settings, "model": str(tiny_model_dir) + "/."}, settings)
    assert same_engine({**settings, "block_size": 16}, settings)  # a default spelled out
    assert not same_engine({**settings, "max_num_seqs": 4}, settings)
    assert not same_engine({**settings, "not_an_engine_setting": 1}, settings)
    assert not same_engine({**settings, "block_size": 3}, settings)  # refused where the engine is built


def test_a_job_with_other_engine_settings_gets_a_second_engine_only_then(tmp_path, tiny_model_dir, monkeypatch):
    """The embedded runner puts a job on the shared engine when its settings build that engine;
    another model or ``max_num_seqs`` gets the process's cached engine, built for it."""
    from engine import LLMEngine
    from pipeline.engine_cache import clear_engine_cache
    from service.runners import EmbeddedRunner

    clear_engine_cache()
    built: list[int] = []
    real_init = LLMEngine.__init__

    def counted(self: LLMEngine, config) -> None:
        built.append(config.max_num_seqs)
        real_init(self, config)

    monkeypatch.setattr(LLMEngine, "__init__", counted)
    share = EngineShare(tiny_engine(tiny_model_dir))
    runner = EmbeddedRunner(engines=share)
    plans = [_plan(tmp_path, tiny_model_dir, name) for name in ("other", "same")]
    plans[0].engine_settings = tiny_engine(tiny_model_dir, max_num_seqs=4)
    for plan in plans:
        runner.submit(plan)
        wait_until(lambda p=plan: runner.status(p.job_id)["status"] in ("succeeded", "failed"), 300, plan.job_id)
        assert runner.status(plan.job_id)["status"] == "succeeded"
    assert built == [4, 8]  # the other settings' engine, then the shared one for the job that matches
    assert share.builds == 1 and not share.views  # the job's side of it left when the job ended
    clear_engine_cache()
