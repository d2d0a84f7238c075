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
