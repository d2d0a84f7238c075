"""``pipeline/engine_share.py`` over the fake engine (no model, milliseconds): each owner aborts
and hears of only its own requests, whoever steps; a failed step rebuilds and tells the others."""

from __future__ import annotations

import pytest
from fake_engine import FakeEngine

from engine import SamplingParams
from pipeline.engine_share import LIVE_PRIORITY, EngineReset, EngineShare


class PriorityFake(FakeEngine):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.priorities: dict[str, int] = {}

    def add_request(self, request_id: str, prompt: list[int], params: SamplingParams, priority: int = 0) -> None:
        super().add_request(request_id, prompt, params)
        self.priorities[request_id] = priority

    def close(self) -> None:
        self.closed = True


def _share(**kwargs) -> tuple[EngineShare, list[PriorityFake]]:
    built: list[PriorityFake] = []

    def build() -> PriorityFake:
        built.append(PriorityFake(max_num_seqs=8, **kwargs))
        return built[-1]

    return EngineShare({"model": "fake"}, build), built


def tokens(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0)


def test_each_owner_aborts_and_hears_of_its_own_requests_only():
    share, built = _share()
    woken: list[str] = []
    live = share.view("live", LIVE_PRIORITY, wake=lambda: woken.append("live"))
    job = share.view("job")
    live.add_request("a1", [5, 6], tokens(1))
    for rid in ("b1", "b2"):
        job.add_request(rid, [7, 8], tokens(3))
    fake = built[0]
    assert fake.priorities == {"a1": -1, "b1": 0, "b2": 0}
    assert job.abort_all() == ["b1", "b2"]  # a run's start: its own leftovers, not the live one
    assert fake.aborted == ["b1", "b2"] and set(fake.requests) == {"a1"}
    job.add_request("b3", [7, 8], tokens(2))
    assert job.step() == []  # its step finished the live request: into the live side's mailbox
    assert woken == ["live"] and [o.request_id for o in live.mailbox] == ["a1"]
    steps = fake.steps
    assert [o.request_id for o in live.step()] == ["a1"] and fake.steps == steps  # delivered, no step
    assert not live.has_unfinished() and job.has_unfinished()
    assert [o.request_id for o in job.step()] == ["b3"]
    live.add_request("a2", [5], tokens(5))
    live.abort_request("b9")  # not its own: nothing happens
    job.abort_request("a2")
    assert "a2" in fake.requests
    share.leave(job)
    assert share.views == [live] and share.builds == 1


def test_a_failed_step_rebuilds_and_the_other_owner_learns_at_its_next_step():
    share, built = _share(fail_at_step=2)
    live, job = share.view("live", LIVE_PRIORITY), share.view("job")
    live.add_request("a1", [5, 6], tokens(1))
    job.add_request("b1", [7, 8], tokens(5))
    assert [o.request_id for o in live.step()] == ["a1"]  # step 1
    live.add_request("a2", [5, 6], tokens(5))
    with pytest.raises(RuntimeError, match="simulated kernel crash"):
        job.step()  # step 2 fails: a fresh engine, nobody's requests in it
    assert len(built) == 2 and share.builds == 2 and not built[1].requests
    assert not job.has_unfinished()  # (its driver fails its rows from the exception)
    assert live.has_unfinished()
    with pytest.raises(EngineReset, match="simulated kernel crash"):
        live.step()
    assert not live.has_unfinished()
    live.add_request("a3", [5], tokens(1))  # and carries on with the new engine
    assert [o.request_id for o in live.step()] == ["a3"]
