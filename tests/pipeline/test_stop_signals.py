"""SIGTERM and SIGINT stop a run and keep its finished rows (issue 41, point 2).

In process (tiny model; local and moto): a signal at 20 finished rows, with no periodic
checkpoint due, leaves a checkpoint of at least those rows, no manifest and no lease, and
raises ``RunInterrupted`` (143 / 130); the re-run takes exactly the checkpointed rows. End to
end: SIGTERM to a real ``tokenmill run`` mid-shard exits 143, and the re-run computes only the
rows after the checkpoint. A second signal exits at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pipeline_support import Where, jsonl_bytes, make_plan, tiny_model_toml
from typer.testing import CliRunner

from cli.app import app
from connectors import ShardCheckpoint, list_shards, read_lease, read_manifest, read_parts
from pipeline.job_runner import run_embedded
from pipeline.shard_outcome import ShardOutcome
from pipeline.stop_signals import RunInterrupted

REPO = Path(__file__).resolve().parents[2]


def _docs(count: int) -> list[dict[str, Any]]:
    return [{"id": f"d{i}", "text": f"document number {i} about {i % 7}", "lang": "en"} for i in range(count)]


def _checkpointed(plan) -> int:
    (shard,) = list_shards(plan.input_url, storage_options=plan.storage_options)
    return ShardCheckpoint(plan.output_url, shard.part_id, plan.part_fingerprint(shard.fingerprint),
                           plan.output_options).recorded_rows()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_checkpoints_the_finished_rows_and_the_rerun_starts_after_them(
    where: Where, tiny_model_dir: Path, signum: int,
) -> None:
    where.put("docs.jsonl", jsonl_bytes(_docs(64)))
    plan = make_plan(where.input_url, where.output_url, tiny_model_dir, storage_options=where.options,
                     checkpoint_rows=10_000, checkpoint_seconds=3600.0)  # no periodic checkpoint is due
    sent: list[int] = []
    handlers = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)]

    def signal_at_20(p: ShardOutcome) -> None:
        if p.counts.rows >= 20 and not sent:
            sent.append(p.counts.rows)
            os.kill(os.getpid(), signum)

    with pytest.raises(RunInterrupted) as stopped:
        run_embedded(plan, progress=False, on_progress=signal_at_20)
    assert stopped.value.code == 128 + signum
    assert str(stopped.value).startswith(f"interrupted by {signal.Signals(signum).name}: run test-job stopped 1")
    saved = _checkpointed(plan)
    assert sent[0] <= saved < 64  # every row finished when the signal came, and those finished since
    assert read_manifest(plan.output_url, plan.output_options) is None
    assert read_lease(plan.output_url, plan.output_options) is None  # the re-run need not wait
    assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)] == handlers  # given back

    manifest = run_embedded(plan, progress=False)
    (shard,) = manifest["shards"]
    assert manifest["status"] == "succeeded" and shard["rows"] == 64 and shard["rows_resumed"] == saved
    assert read_parts(plan.output_url, plan.output_options).column("id").to_pylist() == [f"d{i}" for i in range(64)]


def test_a_signal_with_checkpoints_off_says_the_rows_are_lost(tmp_path: Path, tiny_model_dir: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in/docs.jsonl").write_bytes(jsonl_bytes(_docs(32)))
    plan = make_plan(str(tmp_path / "in"), str(tmp_path / "out"), tiny_model_dir, checkpoint_rows=0,
                     checkpoint_seconds=0.0)

    def signal_at_8(p: ShardOutcome) -> None:
        if p.counts.rows >= 8:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(RunInterrupted) as stopped:
        run_embedded(plan, progress=False, on_progress=signal_at_8)
    assert str(stopped.value) == ("interrupted by SIGTERM: run test-job stopped 1 unfinished shards (checkpoints "
                                  "are off: their finished rows are lost) and wrote no manifest; run it again "
                                  "to resume")
    assert not (tmp_path / "out/_checkpoints").exists()


def test_sigterm_to_tokenmill_run_mid_shard_then_the_rerun_resumes(tmp_path: Path, tiny_model_dir: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/a.jsonl").write_bytes(jsonl_bytes(_docs(96)))
    spec = tmp_path / "job.toml"
    spec.write_text('name = "sigterm"\n[input]\nurl = "docs/"\nid_field = "id"\n'
                    '[output]\nurl = "out/"\ncheckpoint_rows = 16\n'
                    f"{tiny_model_toml(tiny_model_dir)}[sampling]\nmax_tokens = 4\nignore_eos = true\n")
    command = [sys.executable, "-m", "cli", "run", str(spec), "--no-progress", "--show", "0", "--json"]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    run = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    checkpoints = tmp_path / "out/_checkpoints"
    deadline = time.monotonic() + 120
    while not list(checkpoints.glob("*/checkpoint.json")):  # the first periodic checkpoint: mid-shard
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        time.sleep(0.02)
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 143, err.decode()
    assert "interrupted by SIGTERM" in err.decode()
    assert not (tmp_path / "out/_lease.json").exists() and not (tmp_path / "out/_manifest.json").exists()
    (record,) = checkpoints.glob("*/checkpoint.json")
    saved = json.loads(record.read_text())["chunks"][-1]["end"]
    assert 16 <= saved < 96

    again = CliRunner().invoke(app, command[3:])  # the same command, in process: one model load less
    assert again.exit_code == 0, again.output
    (shard,) = json.loads(again.output)["shards"]
    assert shard["rows"] == 96 and shard["rows_resumed"] == saved  # only the rows after it computed


def test_a_run_after_the_handled_block_or_on_another_thread_is_not_stopped_by_an_old_signal() -> None:
    """The Python API after a Ctrl-C (caught), then from a worker thread: nothing installed there,
    no crash, and the earlier signal stops nothing."""
    import threading

    from pipeline.stop_signals import stoppable_run

    handlers = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)]
    with stoppable_run() as first:
        os.kill(os.getpid(), signal.SIGINT)
        assert first.signal_name == "SIGINT"
    assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)] == handlers
    seen: list[object] = []

    def on_thread() -> None:
        try:
            with stoppable_run() as later:
                seen.append(later.requested)
        except BaseException as exc:  # noqa: BLE001  (what the thread met is the result)
            seen.append(exc)

    thread = threading.Thread(target=on_thread)
    thread.start()
    thread.join()
    with stoppable_run() as again:
        seen.append(again.requested)
    assert seen == [False, False]


def test_a_second_signal_exits_at_once(tmp_path: Path) -> None:
    script = ("import os, signal, time\n"
              "from pipeline.stop_signals import stoppable_run\n"
              "with stoppable_run():\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    time.sleep(60)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=30,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 143
    assert done.stderr.decode().strip().endswith("second SIGTERM: exiting now")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_tokenmill_lm_eval_stops_on_a_signal(monkeypatch: pytest.MonkeyPatch, signum: int) -> None:
    """``tokenmill lm-eval`` on its in-process engine has no shard to checkpoint: the signal stops
    it at once with 128 + its number (an embedded job inside it checkpoints as above)."""
    import lm_eval.__main__

    from cli.lm_eval_command import run_lm_eval

    def evaluate() -> None:  # stands in for lm-eval busy with the model
        os.kill(os.getpid(), signum)
        time.sleep(30)  # interrupted by the handler's exception
        raise AssertionError("the signal did not stop lm-eval")

    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", evaluate)
    handlers = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)]
    with pytest.raises(RunInterrupted) as stopped:
        run_lm_eval(["--model", "tokenmill"])
    assert stopped.value.code == 128 + signum and str(stopped.value) == f"interrupted by {signal.Signals(signum).name}"
    assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)] == handlers
