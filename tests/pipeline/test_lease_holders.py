"""Leases that know their holder (issue 41, point 3): a lease whose process is gone from this
host is taken over at once, saying so; ``cancel`` ends a fleet job that never started and
releases its lease, so the corrected resubmit is accepted; ``cancel --release`` frees an
output for an operator who knows its holder is dead elsewhere; a job queued where no live
worker listens is warned about at submit. Local and moto (the lease), Redis (the fleet)."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis
from pipeline_support import Where, jsonl_bytes, make_plan
from typer.testing import CliRunner

from cli.app import app
from connectors import Lease, OutputLeased, acquire_lease, read_lease
from connectors.lease import lease_url, pid_space
from connectors.manifest import write_bytes
from pipeline.fleet import cancel_job, job_status, submit_job
from pipeline.job_runner import run_embedded

BROKER = "redis://127.0.0.1:6379/0"


def _plan(where: Where, model_dir: Path, job_id: str = "rerun"):
    where.put("docs.jsonl", jsonl_bytes([{"id": f"d{i}", "text": f"doc {i}", "lang": "en"} for i in range(3)]))
    return make_plan(where.input_url, where.output_url, model_dir, job_id=job_id, storage_options=where.options)


def _leave_lease(plan, host: str, pid: int, space: str | None = None) -> None:
    """A fresh lease as a run killed with SIGKILL leaves it (heartbeat now, not released)."""
    lease = Lease("crashed-run", f"embedded run on {host} pid {pid}", time.time(), 120.0, host, pid,
                  space or pid_space())
    write_bytes(lease_url(plan.output_url), lease.to_bytes(), plan.output_options)


def _gone_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_lease_whose_process_is_gone_from_this_host_is_taken_over_at_once(
    where: Where, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    plan = _plan(where, tiny_model_dir)
    dead = _gone_pid()
    _leave_lease(plan, socket.gethostname(), dead)
    with caplog.at_level(logging.WARNING, logger="connectors.lease"):
        assert run_embedded(plan, progress=False)["status"] == "succeeded"
    assert (f"taking over the lease of run crashed-run on {where.output_url.rstrip('/')} "
            f"(embedded run on {socket.gethostname()} pid {dead}): process {dead} is gone from this host"
            in caplog.text)
    assert read_lease(plan.output_url, plan.output_options) is None


def test_a_lease_of_a_live_process_or_another_host_is_refused(where: Where, tiny_model_dir: Path) -> None:
    plan = _plan(where, tiny_model_dir)
    _leave_lease(plan, socket.gethostname(), os.getppid())  # alive
    with pytest.raises(OutputLeased, match="held by run crashed-run"):
        run_embedded(plan, progress=False)
    elsewhere = _gone_pid()
    _leave_lease(plan, "elsewhere", elsewhere)  # a pid says nothing about another host
    with pytest.raises(OutputLeased, match=r"held by run crashed-run \(embedded run on elsewhere"):
        run_embedded(plan, progress=False)
    # this host's name, but another container's pid namespace (or an earlier boot): its live
    # pid cannot be seen from here, so a missing pid says nothing either
    _leave_lease(plan, socket.gethostname(), elsewhere, "another-boot/pid:[1]")
    with pytest.raises(OutputLeased, match="held by run crashed-run"):
        run_embedded(plan, progress=False)


def test_cancel_release_of_a_spec_frees_its_output(tmp_path: Path, tiny_model_dir: Path) -> None:
    (tmp_path / "in").mkdir()
    where = Where(str(tmp_path / "in"), str(tmp_path / "out"), {})
    plan = _plan(where, tiny_model_dir)
    _leave_lease(plan, "elsewhere", 4242)  # the operator knows that host's run is dead
    spec = tmp_path / "job.toml"
    spec.write_text('name = "r"\n[input]\nurl = "in/"\nid_field = "id"\n[output]\nurl = "out/"\n')
    refused = CliRunner().invoke(app, ["cancel", str(spec)])
    assert refused.exit_code == 1 and "a spec is cancelled only with --release" in refused.output
    alive = os.getppid()
    _leave_lease(plan, socket.gethostname(), alive)  # a run alive on this host is not released
    refused = CliRunner().invoke(app, ["cancel", str(spec), "--release"])
    assert refused.exit_code == 1
    assert refused.output.strip() == (
        f"run crashed-run holding {where.output_url}/ is alive on this host (pid {alive}): stop it "
        "(SIGTERM checkpoints it) instead of releasing its lease")
    assert read_lease(plan.output_url).run_id == "crashed-run"
    _leave_lease(plan, "elsewhere", 4242)
    out = CliRunner().invoke(app, ["cancel", str(spec), "--release"])
    assert out.exit_code == 0, out.output
    assert out.output.strip() == (f"released the lease on {where.output_url}/ held by run crashed-run "
                                  "(embedded run on elsewhere pid 4242)")
    assert read_lease(plan.output_url) is None
    assert run_embedded(plan, progress=False)["status"] == "succeeded"


def test_cancel_of_a_job_no_worker_took_releases_its_lease(
    tmp_path: Path, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "in").mkdir()
    where = Where(str(tmp_path / "in"), str(tmp_path / "out"), {})
    queue = f"nobody-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("TOKENMILL_QUEUE_CHECK_S", "0.3")
    plan = _plan(where, tiny_model_dir, job_id=f"typo-{uuid.uuid4().hex[:6]}")
    try:
        with caplog.at_level(logging.WARNING, logger="pipeline.queue_check"):
            submit_job(plan, BROKER, queue=queue)
        assert f"no live worker consumes queue '{queue}' (none answered within 0.3 s): job {plan.job_id} waits" \
            in caplog.text
        assert read_lease(plan.output_url).run_id == plan.job_id

        out = CliRunner().invoke(app, ["cancel", plan.job_id, "--broker", BROKER])
        assert out.exit_code == 0, out.output
        lines = out.output.splitlines()
        assert lines[0] == f"cancel requested for {plan.job_id} (status: cancelled)"
        assert lines[1] == "no shard had started: the job is cancelled"
        assert lines[2].startswith(f"released its lease on {plan.output_url} (fleet job on ")
        assert read_lease(plan.output_url) is None
        state = job_status(plan.job_id)
        assert state["status"] == "cancelled" and state["shards"][0]["state"] == "cancelled"

        fixed = dataclasses.replace(plan, job_id=plan.job_id + "-fixed")  # the corrected resubmit is accepted
        submit_job(fixed, BROKER, queue=queue)
        assert read_lease(plan.output_url).run_id == fixed.job_id
        assert cancel_job(fixed.job_id)["status"] == "cancelled"
    finally:
        redis.Redis.from_url(BROKER).delete(queue)  # the messages no worker will take


def test_cancel_release_frees_the_lease_of_a_started_job(tmp_path: Path, tiny_model_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "in").mkdir()
    where = Where(str(tmp_path / "in"), str(tmp_path / "out"), {})
    queue = f"dead-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("TOKENMILL_QUEUE_CHECK_S", "0")
    plan = _plan(where, tiny_model_dir, job_id=f"started-{uuid.uuid4().hex[:6]}")
    try:
        submit_job(plan, BROKER, queue=queue)
        from pipeline.job_state import JobStateStore

        JobStateStore().set_shard(plan.job_id, 0, {"state": "running", "url": "x", "worker": "w@gone"})
        state = cancel_job(plan.job_id)  # it started: the cancel leaves the lease to its finalizer
        assert state["status"] == "cancelling" and state["notes"] == []
        assert read_lease(plan.output_url).run_id == plan.job_id
        state = cancel_job(plan.job_id, release=True)  # the operator knows its worker is dead
        assert state["notes"][0].startswith(f"released its lease on {plan.output_url}")
        assert read_lease(plan.output_url) is None
        acquire_lease(plan.output_url, "next", "embedded run")
    finally:
        redis.Redis.from_url(BROKER).delete(queue)
