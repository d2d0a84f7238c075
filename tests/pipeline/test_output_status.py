"""``tokenmill status SPEC`` reports that spec's state (issue 23, point 6, its status part): run 1
succeeded, a re-run under a new prompt was killed with some of 6 parts rewritten; neither spec
may read ``succeeded`` from run 1's manifest, and each counts only the parts current for it."""

from __future__ import annotations

import dataclasses

import pytest
from pipeline_support import local_put, make_plan, write_uniform_shards

from connectors import list_shards, part_is_current, success_marker_exists
from pipeline.fleet import job_status
from pipeline.job_runner import run_embedded
from pipeline.plan import PromptPlan
from pipeline.shard_outcome import ShardState


class Killed(BaseException):
    """The process dies here."""


def _current(plan) -> list[bool]:
    return [part_is_current(plan.output_url, s.part_id, plan.part_fingerprint(s.fingerprint))
            for s in list_shards(plan.input_url)]


def test_status_of_a_spec_speaks_only_for_its_own_plan(tmp_path, tiny_model_dir):
    inp, out = tmp_path / "in", tmp_path / "out"
    write_uniform_shards(local_put(inp), count=6, rows=1, words=4)
    first = make_plan(str(inp), str(out), tiny_model_dir, job_id="status", sampling={
        "max_tokens": 2, "temperature": 0.0, "ignore_eos": True})
    assert run_embedded(first, progress=False)["status"] == "succeeded"
    assert job_status(first)["status"] == "succeeded" and job_status(first)["progress"]["shards_done"] == 6

    second = dataclasses.replace(first, prompt=PromptPlan(system="Translate the document.", user_template="{text}"))
    done = []

    def kill_after_two(outcome) -> None:
        if outcome.state == ShardState.DONE:
            done.append(outcome.index)
            if len(done) == 2:
                raise Killed

    with pytest.raises(Killed):
        run_embedded(second, progress=False, cross_shard=False, on_progress=kill_after_two)
    assert not success_marker_exists(str(out))
    ours, theirs = _current(second), _current(first)
    assert 2 <= sum(ours) < 6 and sum(theirs) == 6 - sum(ours)

    for plan, current in ((second, ours), (first, theirs)):
        state = job_status(plan)
        assert state["status"] == "incomplete", state["status"]
        assert [s["state"] for s in state["shards"]] == ["done" if c else "queued" for c in current]
        assert state["progress"]["shards_done"] == sum(current)
        assert {s["reason"] for s in state["shards"] if s["state"] == "queued"} == {"no part for this spec's plan"}


def test_live_status_counts_shards_rows_and_tokens(monkeypatch):
    """The live status's progress block, from a job's meta and per-shard states (Redis, or the
    service's embedded runner): the same numbers whoever counts them."""
    import pipeline.fleet as fleet

    monkeypatch.setattr(fleet.time, "time", lambda: 1008.0)
    meta = {"name": "n", "kind": "summarize", "status": "queued", "output_url": "s3://o/"}
    shards = {
        0: {"url": "a", "state": "done", "rows_done": 10, "errors": 1, "output_tokens": 100, "prompt_tokens": 50,
            "cached_prompt_tokens": 20, "started_at": 1000.0, "updated_at": 1001.0},
        1: {"url": "b", "state": "running", "rows_done": 3, "output_tokens": 30, "started_at": 1002.0},
        2: {"url": "c"},
    }
    status = fleet.live_status("j", meta, shards)
    assert (status["status"], [r["updated_s_ago"] for r in status["shards"]]) == ("running", [7.0, None, None])
    assert status["progress"] == {
        "shards_total": 3, "shards_queued": 1, "shards_running": 1, "shards_retrying": 0, "shards_done": 1,
        "shards_skipped": 0, "shards_failed": 0, "shards_cancelled": 0, "rows_done": 13, "errors": 1,
        "output_tokens": 130, "prompt_tokens": 50, "cached_prompt_tokens": 20, "tokens_per_s": 16.25,
        "elapsed_s": 8.0,
    }
    assert list(status["progress"]) == ["shards_total", "shards_queued", "shards_running", "shards_retrying",
                                        "shards_done", "shards_skipped", "shards_failed", "shards_cancelled",
                                        "rows_done", "errors", "output_tokens", "prompt_tokens",
                                        "cached_prompt_tokens", "tokens_per_s", "elapsed_s"]
    assert fleet.live_status("j", meta, {0: {"url": "a"}})["status"] == "queued"
    shards[1]["state"] = shards[2]["state"] = "failed"
    assert fleet.live_status("j", meta, shards)["status"] == "finalizing"
