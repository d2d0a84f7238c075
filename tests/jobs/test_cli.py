"""The ``tokenmill`` CLI: ``run`` in process; ``worker``, ``submit``, ``status``, ``cancel`` and
``beat`` against Redis with real worker and beat subprocesses.

Fleet tests use their own queue and Redis key prefix, so nothing of other runs (or other
test modules) is seen."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pipeline_support import jsonl_bytes, tiny_engine, wait_until
from typer.testing import CliRunner

from cli.app import app
from connectors import read_parts
from jobs.kinds import KIND_NAMES  # the default kind first, then by name: every module of jobs/kinds/

REPO = Path(__file__).resolve().parents[2]
BROKER = "redis://127.0.0.1:6379/0"
RESULT_BACKEND = "redis://127.0.0.1:6379/1"
WORKER_START_TIMEOUT = 180
JOB_TIMEOUT = 180

runner = CliRunner()


def tokenmill_cmd() -> list[str]:
    script = Path(sys.executable).parent / "tokenmill"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "cli"]


def model_toml(model_dir: Path) -> str:
    settings = tiny_engine(model_dir)
    lines = [f'path = "{settings.pop("model")}"'] + [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    return "[model]\n" + "\n".join(lines) + "\n"


def write_spec(folder: Path, model_dir: Path, name: str = "cli-job", extra: str = "", docs: int = 5) -> Path:
    """A small summarize job reading ``docs/`` and writing ``out/`` next to the spec."""
    (folder / "docs").mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"doc-{i}", "text": f"Short document number {i} about topic {i % 3}."} for i in range(docs)]
    (folder / "docs/part-0.jsonl").write_bytes(jsonl_bytes(rows))
    spec = folder / f"{name}.toml"
    spec.write_text(
        f'name = "{name}"\n{extra}\n[input]\nurl = "docs/"\nid_field = "id"\n[output]\nurl = "out/"\n'
        f"{model_toml(model_dir)}[sampling]\nmax_tokens = 3\nignore_eos = true\n"
    )
    return spec


# ---- run (embedded), in process ---------------------------------------------------------------


def test_run_prints_summary_and_samples(tmp_path: Path, tiny_model_dir: Path) -> None:
    spec = write_spec(tmp_path / "job", tiny_model_dir)
    result = runner.invoke(app, ["run", str(spec), "--no-progress", "--show", "2"])
    assert result.exit_code == 0, result.output
    out = result.output
    for label in ("status", "succeeded", "rows", "tokens/s", "KV peak use", "prefix hit tokens", "sample outputs"):
        assert label in out
    assert str(tmp_path / "job" / "out") in out.replace("\n", "")  # relative output resolved next to the spec
    assert "doc-0" in out and "doc-1" in out and "doc-2" not in out
    assert len(read_parts(str(tmp_path / "job/out"))) == 5

    again = runner.invoke(app, ["run", str(spec), "--json"])  # parts are current: skipped, still summarised
    assert again.exit_code == 0, again.output
    manifest = json.loads(again.output)
    assert manifest["totals"]["shards_skipped"] == 1 and manifest["totals"]["rows"] == 5

    status = runner.invoke(app, ["status", str(spec), "--json"])  # a spec: state read from its output
    assert status.exit_code == 0, status.output
    assert json.loads(status.output)["status"] == "succeeded"


def file_states(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and mtime: what a read-only command must leave as it is."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_status_of_a_spec_writes_nothing(tmp_path: Path, tiny_model_dir: Path) -> None:
    """``status JOB.toml`` builds the plan read-only: an OpenAI batch's ``_requests/`` is written by
    ``run``, never by ``status``; once there, status reads its parts' state through it."""
    summarize = write_spec(tmp_path / "summarize", tiny_model_dir)
    folder = tmp_path / "batch"
    (folder / "in").mkdir(parents=True)
    requests = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"messages": [{"role": "user", "content": f"question {i}"}]}} for i in range(3)]
    (folder / "in/batch.jsonl").write_bytes(jsonl_bytes(requests))
    batch = folder / "batch.toml"
    batch.write_text('name = "cli-batch"\nkind = "openai_batch"\n[input]\nurl = "in/"\n[output]\nurl = "out/"\n'
                     f"{model_toml(tiny_model_dir)}[sampling]\nmax_tokens = 3\nignore_eos = true\n")

    def status_of(spec: Path) -> dict[str, Any]:
        before = file_states(spec.parent)
        result = runner.invoke(app, ["status", str(spec), "--json"])
        assert result.exit_code == 0, result.output
        assert file_states(spec.parent) == before  # nothing written, nothing rewritten
        return json.loads(result.output)

    for spec in (summarize, batch):
        state = status_of(spec)
        assert state["status"] == "unknown" and [s["state"] for s in state["shards"]] == ["queued"]
        assert not (spec.parent / "out").exists()

    assert runner.invoke(app, ["run", str(batch), "--json"]).exit_code == 0
    assert status_of(batch)["status"] == "succeeded"  # from the manifest
    (folder / "out/_manifest.json").unlink()  # now from the parts of the converted requests
    state = status_of(batch)
    assert [s["state"] for s in state["shards"]] == ["done"] and "_requests" in state["shards"][0]["url"]
    (folder / "in/batch.jsonl").write_bytes(jsonl_bytes(requests[:2]))  # run would convert it again
    assert [s["state"] for s in status_of(batch)["shards"]] == ["queued"]


def test_run_evaluate_writes_report(tmp_path: Path, tiny_model_dir: Path) -> None:
    folder = tmp_path / "eval"
    spec = write_spec(folder, tiny_model_dir, name="cli-eval", extra='kind = "evaluate"')
    rows = [{"id": f"q{i}", "text": f"Question {i}?", "answer": "yes"} for i in range(3)]
    (folder / "docs/part-0.jsonl").write_bytes(jsonl_bytes(rows))
    result = runner.invoke(app, ["run", str(spec), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "accuracy" in result.output and "report.md" in result.output
    assert (folder / "out/report.md").is_file() and (folder / "out/report.png").is_file()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('name = "x"\nkind = "summarise"\n[input]\nurl = "d"\n[output]\nurl = "o"\n',
         "spec error: kind: Input should be " + ", ".join(map(repr, KIND_NAMES[:-1])) + f" or {KIND_NAMES[-1]!r}"),
        ('name = "x"\n[input]\nurl = "d"\ntxt_field = "b"\n[output]\nurl = "o"\n',
         "spec error: input.txt_field: unknown field; did you mean 'text_field'?"),
        ('name = "x"\n[input]\nurl = "d"\n[output]\nurl = "o"\n[prompt]\ntemplate = "{document.__class__}"\n',
         "spec error: prompt.template: field '{document.__class__}' is not a plain field name"),
        ('name = "x"\n[input]\nurl = "d"\n[output]\nurl = "../o"\n',
         "spec error: output.url: '../o' contains a '..' segment"),
        ('name = "x"\n[input]\nurl = "d"\n[output]\nurl = "o"\n[sampling]\nmax_tokens = -1\n',
         "spec error: sampling.max_tokens: Input should be greater than or equal to 1"),
        ('name = "x"\n[input\n', "spec error: "),
    ],
)
def test_spec_errors_exit_2(tmp_path: Path, body: str, message: str) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text(body)
    for command in (["run", str(spec)], ["submit", str(spec)]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, result.output
        assert message in result.output
        assert "Traceback" not in result.output


def test_run_beside_a_live_run_on_its_output_exits_naming_it(tmp_path: Path, tiny_model_dir: Path) -> None:
    from connectors import acquire_lease

    spec = write_spec(tmp_path, tiny_model_dir)
    acquire_lease(str(tmp_path / "out"), "nightly-1a2b", "fleet job on gpu-7 pid 42")
    result = runner.invoke(app, ["run", str(spec), "--no-progress"])
    assert result.exit_code == 1 and "output busy: output " in result.output
    assert "is held by run nightly-1a2b (fleet job on gpu-7 pid 42), last heartbeat" in result.output
    assert not (tmp_path / "out/_manifest.json").exists()


def test_missing_input_is_reported(tmp_path: Path, tiny_model_dir: Path) -> None:
    spec = write_spec(tmp_path, tiny_model_dir)
    (tmp_path / "docs/part-0.jsonl").unlink()
    result = runner.invoke(app, ["run", str(spec), "--no-progress"])
    assert result.exit_code == 1 and "input error: no input files match" in result.output


def test_help_lists_commands() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("run", "submit", "status", "cancel", "worker", "beat", "bench"):
        assert command in result.output


# ---- the fleet: worker, submit, status, cancel, beat ---------------------------------------------



def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


class Fleet:
    def __init__(self, env: dict[str, str], logdir: Path, queue: str) -> None:
        self.env, self.logdir, self.queue = env, logdir, queue
        self.procs: list[tuple[subprocess.Popen, Path]] = []

    def spawn(self, name: str, *args: str) -> tuple[subprocess.Popen, Path]:
        log = self.logdir / f"{name}.log"
        proc = subprocess.Popen([*tokenmill_cmd(), *args], cwd=REPO, env=self.env, stdout=log.open("wb"),
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((proc, log))
        return proc, log

    def logs(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for _, log in self.procs)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, tiny_model_dir: Path) -> Iterator[Fleet]:
    try:
        socket.create_connection(("127.0.0.1", 6379), timeout=2).close()
    except OSError:
        if os.environ.get("CI"):
            pytest.fail("Redis is not reachable on 127.0.0.1:6379")  # never silently skipped in CI
        pytest.skip("Redis is not reachable on 127.0.0.1:6379")
    run_id = uuid.uuid4().hex[:10]
    queue, prefix = f"tm-cli-{run_id}", f"tm-cli-{run_id}:"
    settings = {
        "TOKENMILL_RESULT_BACKEND": RESULT_BACKEND,
        "TOKENMILL_QUEUE": queue,
        "TOKENMILL_REDIS_KEY_PREFIX": prefix,
        "TOKENMILL_PRELOAD_ENGINE": json.dumps(tiny_engine(tiny_model_dir)),  # warm before "ready"
    }
    fleet = Fleet({**os.environ, **settings}, tmp_path_factory.mktemp("cli-fleet"), queue)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in settings.items():  # this process submits and polls with the same settings
            mp.setenv(key, value)
        worker, log = fleet.spawn("worker", "worker", "--broker", BROKER, "--queues", queue)
        try:
            def ready() -> bool:
                if worker.poll() is not None:
                    raise RuntimeError(f"worker exited with {worker.returncode}:\n{log.read_text()[-3000:]}")
                return " ready." in log.read_text()

            wait_until(ready, WORKER_START_TIMEOUT, "worker ready")
            yield fleet
        finally:
            for proc, _ in fleet.procs:
                stop(proc)
            broker = redis.Redis.from_url(BROKER)
            for key in broker.scan_iter(f"{prefix}*"):
                broker.delete(key)
            state = redis.Redis.from_url(RESULT_BACKEND)
            for key in state.scan_iter(f"tokenmill:job:cli-{run_id}*"):
                state.delete(key)


def test_submit_status_worker(fleet: Fleet, tmp_path: Path, tiny_model_dir: Path) -> None:
    name = f"cli-{fleet.queue.removeprefix('tm-cli-')}-submit"
    spec = write_spec(tmp_path, tiny_model_dir, name=name, docs=6)
    (tmp_path / "docs/part-1.jsonl").write_bytes(jsonl_bytes([{"id": "second", "text": "Another shard."}]))
    result = runner.invoke(app, ["submit", str(spec), "--broker", BROKER, "--queue", fleet.queue])
    assert result.exit_code == 0, result.output
    job_id = result.output.strip().splitlines()[-1]
    assert job_id.startswith(f"{name}-")

    def finished() -> dict[str, Any] | None:
        status = runner.invoke(app, ["status", job_id, "--json"])
        assert status.exit_code == 0, status.output
        state = json.loads(status.output)
        return state if state["status"] in ("succeeded", "completed_with_errors", "failed", "cancelled") else None

    try:
        state = wait_until(finished, JOB_TIMEOUT, f"job {job_id}")
    except TimeoutError:
        raise AssertionError(fleet.logs()) from None
    assert state["status"] == "succeeded", fleet.logs()
    assert state["progress"]["rows_done"] == 7 and [s["state"] for s in state["shards"]] == ["done", "done"]
    assert len(read_parts(str(tmp_path / "out"))) == 7

    table = runner.invoke(app, ["status", job_id])  # the human-readable table
    assert table.exit_code == 0 and "succeeded" in table.output and "done" in table.output
    cancelled = runner.invoke(app, ["cancel", job_id])
    assert cancelled.exit_code == 0 and "cancel requested" in cancelled.output
    unknown = runner.invoke(app, ["status", f"no-such-job-{uuid.uuid4().hex}"])
    assert unknown.exit_code == 1 and "unknown job" in unknown.output


def test_python_api_submit_status_wait(fleet: Fleet, tmp_path: Path, tiny_model_dir: Path) -> None:
    """``from jobs import submit, status, wait, JobSpec``: the call a data pipeline makes."""
    from jobs import JobSpec, status, submit, wait

    name = f"cli-{fleet.queue.removeprefix('tm-cli-')}-api"
    (tmp_path / "docs").mkdir()
    rows = [{"id": f"api-{i}", "text": f"Document {i} for the Python API."} for i in range(4)]
    (tmp_path / "docs/part-0.jsonl").write_bytes(jsonl_bytes(rows))
    settings = tiny_engine(tiny_model_dir)
    spec = JobSpec.from_dict({
        "name": name,
        "input": {"url": str(tmp_path / "docs"), "id_field": "id"},
        "output": {"url": str(tmp_path / "out")},
        "model": {"path": settings.pop("model"), **settings},
        "sampling": {"max_tokens": 3, "ignore_eos": True},
    })
    job_id = submit(spec, BROKER, queue=fleet.queue, result_backend=RESULT_BACKEND)
    assert job_id.startswith(f"{name}-")
    with pytest.raises(TimeoutError, match=f"job {job_id} still (queued|running) after 0s"):
        wait(job_id, timeout=0)  # milliseconds after submit: not done yet
    assert status(job_id)["job_id"] == job_id
    final = wait(job_id, timeout=JOB_TIMEOUT, poll=0.3)
    assert final["status"] == "succeeded", fleet.logs()
    assert final["progress"]["rows_done"] == 4
    assert sorted(read_parts(str(tmp_path / "out")).column("id").to_pylist()) == [f"api-{i}" for i in range(4)]


def test_redis_broker_option_carries_job_state(monkeypatch: pytest.MonkeyPatch) -> None:
    from cli.support import redis_database, use_broker

    assert redis_database("redis://:pw@queue.internal:6380/0", 1) == "redis://:pw@queue.internal:6380/1"
    monkeypatch.delenv("TOKENMILL_BROKER_URL", raising=False)  # recorded first: restored after the test
    monkeypatch.delenv("TOKENMILL_RESULT_BACKEND", raising=False)
    use_broker("redis://queue.internal:6380/0")
    assert os.environ["TOKENMILL_RESULT_BACKEND"] == "redis://queue.internal:6380/1"
    monkeypatch.setenv("TOKENMILL_RESULT_BACKEND", "redis://results.internal/2")
    use_broker("redis://queue.internal:6380/0")
    assert os.environ["TOKENMILL_RESULT_BACKEND"] == "redis://results.internal/2"  # an explicit backend wins
    monkeypatch.delenv("TOKENMILL_RESULT_BACKEND")
    use_broker("amqp://guest:guest@rabbit.internal//")
    assert "TOKENMILL_RESULT_BACKEND" not in os.environ


def test_beat_enqueues_scheduled_job(fleet: Fleet, tmp_path: Path, tiny_model_dir: Path) -> None:
    name = f"cli-{fleet.queue.removeprefix('tm-cli-')}-beat"
    specs = tmp_path / "schedules"
    write_spec(specs, tiny_model_dir, name=name, extra='schedule = "every 2s"', docs=3)
    write_spec(specs / "unscheduled", tiny_model_dir, name="not-served")  # a subfolder: not read
    (specs / "notes.txt").write_text("not a spec")
    beat, log = fleet.spawn("beat", "beat", "--jobs", str(specs), "--broker", BROKER, "--queue", fleet.queue)
    state = redis.Redis.from_url(RESULT_BACKEND)

    def succeeded_run() -> str | None:
        if beat.poll() is not None:
            raise RuntimeError(f"beat exited with {beat.returncode}:\n{log.read_text()[-3000:]}")
        for key in state.scan_iter(f"tokenmill:job:{name}-*:meta"):
            if json.loads(state.hget(key, "status") or "null") == "succeeded":
                return key.decode().split(":")[2]
        return None

    try:
        job_id = wait_until(succeeded_run, JOB_TIMEOUT, "a scheduled run to succeed")
    except TimeoutError:
        raise AssertionError(fleet.logs()) from None
    finally:
        stop(beat)
    assert job_id.startswith(f"{name}-")  # <name>-<UTC time>-<random>
    assert sorted(read_parts(str(specs / "out")).column("id").to_pylist()) == ["doc-0", "doc-1", "doc-2"]
    assert f"beat: {name} (every 2s)" in log.read_text()


def test_beat_rejects_bad_specs(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('name = "b"\nschedule = "61 * * * *"\n[input]\nurl = "d"\n[output]\nurl = "o"\n')
    result = runner.invoke(app, ["beat", "--jobs", str(tmp_path)])
    assert result.exit_code == 2 and f"spec error: {tmp_path / 'bad.toml'}: schedule: '61 * * * *' is not" in result.output
    (tmp_path / "bad.toml").write_text('name = "b"\n[input]\nurl = "d"\n[output]\nurl = "o"\n')
    result = runner.invoke(app, ["beat", "--jobs", str(tmp_path)])
    assert result.exit_code == 2 and "no spec with a schedule" in result.output


def test_beat_schedule_entries(tmp_path: Path) -> None:
    from celery.schedules import crontab

    from jobs import JobSpec
    from jobs.scheduled import ENQUEUE_TASK, beat_schedule, enqueue_scheduled_job

    nightly = JobSpec.from_dict({"name": "nightly", "schedule": "30 2 * * *", "input": {"url": "in/"},
                                 "output": {"url": "out/"}}, base_dir=tmp_path)
    often = JobSpec.from_dict({**nightly.to_data(), "name": "often", "schedule": "every 5s"})
    entries = beat_schedule({tmp_path / "a.toml": nightly, tmp_path / "b.toml": often}, None, "q1")
    assert entries["nightly"]["schedule"] == crontab(minute="30", hour="2")
    assert entries["often"]["schedule"].run_every.total_seconds() == 5
    assert entries["nightly"]["task"] == ENQUEUE_TASK == enqueue_scheduled_job.name
    spec_data, broker, queue = entries["nightly"]["args"]
    assert (broker, queue, entries["nightly"]["options"]) == (None, "q1", {"queue": "q1"})
    assert JobSpec.from_dict(json.loads(json.dumps(spec_data))) == nightly  # travels as JSON, paths absolute
    with pytest.raises(ValueError, match="used by another scheduled spec"):
        beat_schedule({tmp_path / "a.toml": nightly, tmp_path / "c.toml": nightly}, None, "q1")


def test_a_marker_secret_never_leaves_the_spec(s3_server, s3_bucket, tmp_path: Path, tiny_model_dir: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """A whole embedded run over S3, with a bad row and a corrupt shard, writes the spec's
    secret nowhere: not in the CLI output, the logs (INFO, as workers run), the manifest,
    the parts or the report."""
    import logging

    marker = f"MARKER-SECRET-{uuid.uuid4().hex}"
    s3 = s3_server.client()
    rows = [{"id": "ok", "text": "A short document."}, {"id": "bad", "text": ""}]
    s3.put_object(Bucket=s3_bucket, Key="in/a.jsonl", Body=jsonl_bytes(rows))
    s3.put_object(Bucket=s3_bucket, Key="in/b.parquet", Body=b"PAR1 corrupt")
    spec = tmp_path / "secret.toml"
    spec.write_text(
        f'name = "secret-job"\n[input]\nurl = "s3://{s3_bucket}/in/"\nid_field = "id"\n'
        f'storage_options = {{ key = "testing", secret = "{marker}", '
        f'client_kwargs = {{ endpoint_url = "{s3_server.endpoint_url}" }} }}\n'
        f'[output]\nurl = "s3://{s3_bucket}/out/"\n{model_toml(tiny_model_dir)}[sampling]\nmax_tokens = 2\n'
    )
    with caplog.at_level(logging.INFO):
        result = runner.invoke(app, ["run", str(spec), "--no-progress"])
    assert result.exit_code == 1, result.output  # the corrupt shard: completed with errors
    assert "completed_with_errors" in result.output
    everything = [result.output, caplog.text]
    for obj in s3.list_objects_v2(Bucket=s3_bucket, Prefix="out/")["Contents"]:
        everything.append(s3.get_object(Bucket=s3_bucket, Key=obj["Key"])["Body"].read().decode("latin-1"))
    assert any('"status": "completed_with_errors"' in text for text in everything)  # the manifest was read
    for text in everything:
        assert marker not in text
