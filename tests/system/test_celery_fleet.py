"""The Celery fleet for real: worker subprocesses on Redis, S3 on loopback, cancellation,
idempotent redelivery, a broker restart (RabbitMQ and workers killed mid-shard:
tests/system/test_faults_fleet.py).

Every run uses its own queue name and Redis key prefix, so stale messages of other
runs (or other fleets on the same Redis) are never seen, and the short visibility
timeout used here cannot touch anybody else's unacknowledged messages.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

# The fleet helpers live in tests/fleet_support.py; the other fleet tests import them from here too.
from fleet_support import (  # noqa: F401  (RABBIT_BROKER, Worker: re-exported)
    JOB_TIMEOUT,
    RABBIT_BROKER,
    REDIS_BROKER,
    RESULT_BACKEND,
    Fleet,
    Worker,
    _fleet_env,
    _make_fleet,
    _require,
)
from pipeline_support import (
    expected_ids,
    local_put,
    make_plan,
    tiny_engine,
    wait_until,
    write_mixed_inputs,
    write_uniform_shards,
)

from connectors import list_shards, read_manifest, read_parts, success_marker_exists
from pipeline.fleet import cancel_job, job_status, submit_job, wait_for_job
from pipeline.job_state import JobStateStore
from pipeline.job_status import FINAL_JOB_STATUSES


@pytest.fixture(scope="module")
def s3_env(s3_server) -> dict[str, str]:
    """How workers reach the loopback S3: endpoint and credentials from the environment only."""
    return {
        "TOKENMILL_S3_ENDPOINT_URL": s3_server.endpoint_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


@pytest.fixture(scope="module")
def redis_fleet(tmp_path_factory, s3_env, tiny_model_dir) -> Iterator[Fleet]:
    _require(6379, "Redis")
    yield from _make_fleet(REDIS_BROKER, tmp_path_factory, tiny_model_dir, s3_env)


@pytest.fixture(scope="module")
def redis_threads_fleet(tmp_path_factory, s3_env, tiny_model_dir) -> Iterator[Fleet]:
    """Workers as ``tokenmill worker`` starts them by default: two shard tasks per engine."""
    _require(6379, "Redis")
    yield from _make_fleet(REDIS_BROKER, tmp_path_factory, tiny_model_dir, s3_env, pool="threads")


_JOB_IDS: list[str] = []


def _job_id(tag: str) -> str:
    job_id = f"test-{tag}-{uuid.uuid4().hex[:8]}"
    _JOB_IDS.append(job_id)
    return job_id


@pytest.fixture(scope="module", autouse=True)
def _forget_job_state() -> Iterator[None]:
    yield
    try:
        r = redis.Redis.from_url(RESULT_BACKEND)
        for job_id in _JOB_IDS:
            r.delete(*(f"tokenmill:job:{job_id}:{what}" for what in ("meta", "shards", "cancel")))
    except redis.RedisError:
        pass


def _wait(fleet: Fleet, job_id: str) -> dict[str, Any]:
    try:
        return wait_for_job(job_id, JOB_TIMEOUT, poll_s=0.5)
    except TimeoutError:
        raise AssertionError(f"job {job_id} did not finish: {job_status(job_id)}\n{fleet.logs()}") from None


def test_client_apps_carry_the_key_prefix_they_were_asked_for(monkeypatch) -> None:
    from pipeline.fleet import _client_app

    monkeypatch.setenv("TOKENMILL_REDIS_KEY_PREFIX", "from-env:")
    assert _client_app(REDIS_BROKER, RESULT_BACKEND, "q").conf.broker_transport_options["global_keyprefix"] == "from-env:"
    explicit = _client_app(REDIS_BROKER, RESULT_BACKEND, "q", "fleet-b:")
    assert explicit.conf.broker_transport_options["global_keyprefix"] == "fleet-b:"
    monkeypatch.setenv("TOKENMILL_REDIS_KEY_PREFIX", "other:")  # not a stale cached app
    assert _client_app(REDIS_BROKER, RESULT_BACKEND, "q").conf.broker_transport_options["global_keyprefix"] == "other:"


# ---- end to end on Redis + S3 ---------------------------------------------------------------


def test_end_to_end_redis_s3_two_workers(redis_fleet, s3_server, s3_bucket, tiny_model_dir) -> None:
    redis_fleet.ensure(2)
    s3 = s3_server.client()

    def put(name: str, data: bytes) -> None:
        s3.put_object(Bucket=s3_bucket, Key=f"in/{name}", Body=data)

    files = write_mixed_inputs(put)
    uniform = write_uniform_shards(put, count=4, rows=5)
    put("corrupt.parquet", b"PAR1 but not really parquet")
    put("zz-missing.jsonl", b'{"id": "gone", "text": "deleted after listing", "lang": "en"}\n')
    plan = make_plan(f"s3://{s3_bucket}/in/", f"s3://{s3_bucket}/out", tiny_model_dir, job_id=_job_id("e2e"))
    assert len(list_shards(plan.input_url)) == 9  # endpoint from $TOKENMILL_S3_ENDPOINT_URL, no storage_options

    job_id = redis_fleet.submit(plan)
    s3.delete_object(Bucket=s3_bucket, Key="in/zz-missing.jsonl")  # listed, then gone: an unreadable shard
    seen = set()
    deadline = time.monotonic() + JOB_TIMEOUT
    while (status := job_status(job_id))["status"] not in FINAL_JOB_STATUSES:
        seen.add(status["status"])
        assert time.monotonic() < deadline, f"job stuck: {status}\n{redis_fleet.logs()}"
        time.sleep(0.3)
    assert seen & {"queued", "running", "finalizing"}  # state was readable while the job ran

    assert status["status"] == "completed_with_errors", redis_fleet.logs()
    failed = {s["url"].rsplit("/", 1)[1]: s["reason"] for s in status["shards"] if s["state"] == "failed"}
    assert set(failed) == {"corrupt.parquet", "zz-missing.jsonl"}
    assert "no such file" in failed["zz-missing.jsonl"]

    output = read_parts(plan.output_url, storage_options=s3_server.storage_options)
    ids = output.column("id").to_pylist()
    assert sorted(ids) == sorted(expected_ids(files) + uniform)  # every readable input row, once
    assert len(ids) == len(set(ids))

    manifest = read_manifest(plan.output_url, storage_options=s3_server.storage_options)
    assert manifest["status"] == "completed_with_errors" and manifest["mode"] == "celery"
    bad = {s["url"].rsplit("/", 1)[1]: s for s in manifest["shards"] if s["status"] == "failed"}
    assert set(bad) == {"corrupt.parquet", "zz-missing.jsonl"} and all(s["reason"] for s in bad.values())
    assert manifest["totals"]["rows"] == len(ids) and manifest["totals"]["shards_done"] == 7
    assert not success_marker_exists(plan.output_url, storage_options=s3_server.storage_options)
    assert len(manifest["engine_stats"]["workers"]) == 2  # both workers took shards


# ---- the soak bench at CI size --------------------------------------------------------------


def test_soak_ci_sized_two_workers_redis_s3(redis_threads_fleet, s3_server, s3_bucket, tiny_model_dir) -> None:
    """bench/soak.py's job scaled down: 2,000 rows in 8 shards, two workers on Redis, S3 on
    loopback, max_tokens 8. Every input id comes out exactly once, every shard done, and the
    broker's queue and unacked set are empty afterwards."""
    fleet = redis_threads_fleet
    fleet.ensure(2)
    s3 = s3_server.client()
    ids = write_uniform_shards(lambda name, data: s3.put_object(Bucket=s3_bucket, Key=f"soak/{name}", Body=data),
                               count=8, rows=250, words=6)
    plan = make_plan(f"s3://{s3_bucket}/soak/", f"s3://{s3_bucket}/soak-out", tiny_model_dir,
                     job_id=_job_id("soak"), sampling={"max_tokens": 8, "temperature": 0.0, "ignore_eos": True})
    status = _wait(fleet, fleet.submit(plan))

    assert status["status"] == "succeeded", fleet.logs()
    output = read_parts(plan.output_url, storage_options=s3_server.storage_options)
    out_ids = output.column("id").to_pylist()
    assert len(out_ids) == len(ids) == 2000 and sorted(out_ids) == sorted(ids)
    assert set(output.column("output_tokens").to_pylist()) == {8}
    manifest = read_manifest(plan.output_url, storage_options=s3_server.storage_options)
    assert manifest["totals"]["shards_done"] == 8 and manifest["totals"]["errors"] == 0
    assert len(manifest["engine_stats"]["workers"]) == 2
    broker = redis.Redis.from_url(REDIS_BROKER)
    prefix = fleet.env["TOKENMILL_REDIS_KEY_PREFIX"]
    assert broker.llen(f"{prefix}{fleet.queue}") == 0 and broker.hlen(f"{prefix}unacked") == 0


# ---- cancellation ---------------------------------------------------------------------------


def test_cancel_job(redis_fleet, tmp_path, tiny_model_dir) -> None:
    redis_fleet.ensure(2)
    inp = tmp_path / "in"
    write_uniform_shards(local_put(inp), count=6, rows=200)
    plan = make_plan(str(inp), str(tmp_path / "out"), tiny_model_dir, job_id=_job_id("cancel"),
                     sampling={"max_tokens": 32, "temperature": 0.0, "ignore_eos": True})
    job_id = redis_fleet.submit(plan)
    # cancel once workers have started: two shards at most are taken, four still queued
    wait_until(lambda: any(s["state"] != "queued" for s in job_status(job_id)["shards"]), 120, "a started shard")
    cancel_job(job_id)
    status = _wait(redis_fleet, job_id)
    assert status["status"] == "cancelled"
    states = [s["state"] for s in status["shards"]]
    assert "cancelled" in states and "queued" not in states and "running" not in states
    manifest = read_manifest(plan.output_url)
    assert manifest["status"] == "cancelled"
    assert not success_marker_exists(plan.output_url)
    # exactly the parts of the shards that finished before the cancel (parts are named by their
    # content id, not the shard index: the manifest maps one to the other)
    done = sorted(s["part_file"] for s in manifest["shards"] if s["status"] == "done")
    assert sorted(p.name for p in (tmp_path / "out").glob("part-*.parquet")) == done


# ---- a worker killed mid-shard: tests/system/test_faults_fleet.py (threads pool, S3, two shards held) ----


def test_threads_worker_builds_its_engine_on_the_service_thread_before_ready(redis_threads_fleet) -> None:
    """The threads pool sends no worker_process_init: the preload runs on worker_ready instead,
    on the thread that will run the engine, before the worker says it is ready. (The soak's
    workers: the broker plays no part here, so no fleet of its own is started for it.)"""
    redis_threads_fleet.ensure(1)
    log = redis_threads_fleet.alive()[0].log.read_text()
    built = log.index("engine built and warmed for ")
    assert "(tokenmill-engine)" in log[built:built + 300]
    assert built < log.index(" ready.")


# ---- in-process task calls ------------------------------------------------------------------


def test_redelivery_of_a_committed_shard_is_a_noop(tmp_path, tiny_model_dir) -> None:
    _require(6379, "Redis")
    from pipeline.tasks import process_shard

    inp, out = tmp_path / "in", tmp_path / "out"
    ids = write_uniform_shards(local_put(inp), count=1, rows=4)
    plan = make_plan(str(inp), str(out), tiny_model_dir, job_id=_job_id("noop"))
    (shard,) = list_shards(plan.input_url)
    JobStateStore().init_job(plan.job_id, {"name": plan.name}, [shard.to_dict()])

    first = process_shard(plan.to_dict(), shard.to_dict())
    part = out / f"part-{shard.part_id}.parquet"
    stamp = part.stat().st_mtime_ns
    second = process_shard(plan.to_dict(), shard.to_dict())
    assert first["status"] == "done" and second["status"] == "skipped"
    assert part.stat().st_mtime_ns == stamp
    assert second["rows"] == first["rows"] == len(ids)
    assert second["output_tokens"] == first["output_tokens"]
    assert sorted(read_parts(plan.output_url).column("id").to_pylist()) == sorted(ids)


def test_cancelled_job_skips_queued_shards_and_errback_writes_failed_manifest(tmp_path, tiny_model_dir) -> None:
    _require(6379, "Redis")
    from pipeline.tasks import finalize_job, job_failed, process_shard

    inp, out = tmp_path / "in", tmp_path / "out"
    write_uniform_shards(local_put(inp), count=2, rows=2)
    plan = make_plan(str(inp), str(out), tiny_model_dir, job_id=_job_id("flags"))
    shards = list_shards(plan.input_url)
    store = JobStateStore()
    store.init_job(plan.job_id, {"name": plan.name, "submitted_at": time.time()}, [s.to_dict() for s in shards])
    store.cancel(plan.job_id)
    results = [process_shard(plan.to_dict(), s.to_dict()) for s in shards]
    assert [r["status"] for r in results] == ["cancelled", "cancelled"]
    assert finalize_job(results, plan.to_dict())["status"] == "cancelled"
    assert job_status(plan.job_id)["status"] == "cancelled"

    job_failed(None, RuntimeError("boom"), None, plan_dict=plan.to_dict())
    manifest = read_manifest(plan.output_url)
    assert manifest["status"] == "failed" and "boom" in manifest["error"]
    assert not success_marker_exists(plan.output_url)


def test_finalize_waits_for_a_shard_the_chord_counted_twice(tmp_path, tiny_model_dir) -> None:
    """A redelivered shard is counted twice by the Redis chord, which can then fire while
    another shard still runs: the finalizer retries instead of writing a manifest without it."""
    _require(6379, "Redis")
    from celery.exceptions import Retry

    from pipeline.tasks import FINALIZE_MAX_RETRIES, finalize_job, process_shard

    inp, out = tmp_path / "in", tmp_path / "out"
    ids = write_uniform_shards(local_put(inp), count=2, rows=3)
    plan = make_plan(str(inp), str(out), tiny_model_dir, job_id=_job_id("early"))
    shards = list_shards(plan.input_url)
    store = JobStateStore()
    store.init_job(plan.job_id, {"name": plan.name, "submitted_at": time.time()}, [s.to_dict() for s in shards])
    first = process_shard(plan.to_dict(), shards[0].to_dict())
    duplicate = process_shard(plan.to_dict(), shards[0].to_dict())
    assert (first["status"], duplicate["status"]) == ("done", "skipped")
    store.set_shard(plan.job_id, 1, {"state": "running", "url": shards[1].url})
    indices = [s.index for s in shards]

    with pytest.raises(Retry):
        finalize_job([first, duplicate], plan.to_dict(), shard_indices=indices)
    assert not success_marker_exists(plan.output_url)
    assert read_manifest(plan.output_url) is None

    # after a day of waiting a shard whose message was lost for good is failed, not waited on forever
    gave_up = finalize_job.apply(args=([first, duplicate], plan.to_dict()), kwargs={"shard_indices": indices},
                                 retries=FINALIZE_MAX_RETRIES).get()
    assert gave_up["status"] == "completed_with_errors"
    lost = read_manifest(plan.output_url)["shards"][1]
    assert lost["status"] == "failed" and lost["reason"] == "no result after waiting 24 h"

    assert process_shard(plan.to_dict(), shards[1].to_dict())["status"] == "done"
    done = finalize_job([first, duplicate], plan.to_dict(), shard_indices=indices)
    assert done["status"] == "succeeded" and done["totals"]["rows"] == len(ids)
    assert success_marker_exists(plan.output_url)
    assert sorted(read_parts(plan.output_url).column("id").to_pylist()) == sorted(ids)


class _ShellOnUnpickle:
    """A pickle payload that runs a shell command when loaded."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_pickled_message_is_refused_not_executed(redis_fleet, tmp_path, tiny_model_dir) -> None:
    """Workers accept JSON only: a pickled task message on the queue is refused unread, and the
    worker goes on serving."""
    import pickle

    redis_fleet.ensure(2)
    live = tmp_path / "payload-is-live"
    pickle.loads(pickle.dumps(_ShellOnUnpickle(f"touch {live}")))
    assert live.exists()  # the payload really runs when unpickled

    marker = tmp_path / "pwned"
    redis_fleet.client().send_task("tokenmill.process_shard", args=(_ShellOnUnpickle(f"touch {marker}"),),
                     serializer="pickle", queue=redis_fleet.queue)
    wait_until(lambda: "Refusing to deserialize untrusted content of type pickle" in redis_fleet.logs(), 60,
               "a worker to refuse the pickled message")
    assert not marker.exists()

    inp = tmp_path / "in"
    ids = write_uniform_shards(local_put(inp), count=1, rows=3)
    plan = make_plan(str(inp), str(tmp_path / "out"), tiny_model_dir, job_id=_job_id("after-pickle"))
    assert _wait(redis_fleet, redis_fleet.submit(plan))["status"] == "succeeded"
    assert sorted(read_parts(plan.output_url).column("id").to_pylist()) == sorted(ids)


# ---- the broker restarted mid-job ------------------------------------------------------------


@dataclass
class OwnRedis:
    """A Redis server this test starts, stops and restarts (AOF on, so queued and unacked
    messages survive a restart as on a production broker)."""

    port: int
    workdir: Path
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        import shutil

        binary = shutil.which("redis-server")
        if binary is None:
            message = "redis-server is not installed"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
             "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
            stdout=(self.workdir / "redis.log").open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
        )

        def pong() -> bool:
            try:
                return bool(redis.Redis.from_url(self.url, socket_timeout=1).ping())
            except redis.RedisError:
                return False

        wait_until(pong, 30, f"redis-server on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: Redis flushes the AOF and exits
            self.proc.wait(timeout=30)


@pytest.fixture
def own_redis(tmp_path) -> Iterator[OwnRedis]:
    from s3_server import free_port

    server = OwnRedis(free_port(), tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_broker_restart_mid_job_completes(own_redis, tmp_path_factory, tmp_path, tiny_model_dir) -> None:
    """Stop the broker (which also holds results and job state) while shards run, start it
    again a few seconds later: workers reconnect and the job completes, every id once."""
    env = {
        "TOKENMILL_BROKER_URL": f"{own_redis.url}/0",
        "TOKENMILL_RESULT_BACKEND": f"{own_redis.url}/1",
        "TOKENMILL_PRELOAD_ENGINE": json.dumps(tiny_engine(tiny_model_dir)),
    }
    run = uuid.uuid4().hex[:10]
    # The shards the restart interrupted come back when their visibility timeout runs out, so the
    # job ends that long after the restart: 15 s here, not the fleet default's 30 s (these shards,
    # 120 rows of 24 tokens, take a few seconds; a redelivered committed shard is skipped anyway).
    env["TOKENMILL_VISIBILITY_TIMEOUT"] = "15"
    fleet_env = _fleet_env(env["TOKENMILL_BROKER_URL"], f"tm-test-{run}", f"tm-test-{run}:", env)
    fleet = Fleet(fleet_env["TOKENMILL_BROKER_URL"], fleet_env["TOKENMILL_QUEUE"], {**os.environ, **fleet_env},
                  tmp_path_factory.mktemp(f"fleet-restart-{run}"), pool="threads")
    inp = tmp_path / "in"
    ids = write_uniform_shards(local_put(inp), count=6, rows=120)
    plan = make_plan(str(inp), str(tmp_path / "out"), tiny_model_dir, job_id=_job_id("restart"),
                     sampling={"max_tokens": 24, "temperature": 0.0, "ignore_eos": True})
    with pytest.MonkeyPatch.context() as mp:
        for key, value in fleet_env.items():
            mp.setenv(key, value)
        try:
            fleet.start(2)
            job_id = submit_job(plan, fleet.broker_url, result_backend=fleet_env["TOKENMILL_RESULT_BACKEND"],
                                queue=fleet.queue)
            wait_until(lambda: any(s["state"] != "queued" for s in job_status(job_id)["shards"]), 120,
                       "a started shard")
            own_redis.stop()
            time.sleep(3)
            assert all(w.proc.poll() is None for w in fleet.workers)  # workers wait, they do not exit
            own_redis.start()
            status = _wait(fleet, job_id)
            assert status["status"] == "succeeded", fleet.logs()
            output = read_parts(plan.output_url).column("id").to_pylist()
            assert sorted(output) == sorted(ids) and len(output) == len(set(output))
            assert success_marker_exists(plan.output_url)
        finally:
            fleet.stop()


def test_redis_transport_options_come_from_the_environment(monkeypatch) -> None:
    """What the fleet tests rely on: each knob reaches kombu under its own name."""
    from pipeline.celery_app import redis_transport_options

    for name, value in (("TOKENMILL_VISIBILITY_TIMEOUT", "20"), ("TOKENMILL_RESTORE_INTERVAL", "1"),
                        ("TOKENMILL_RESTORE_THROTTLE", "1"), ("TOKENMILL_RESTORE_MUTEX_EXPIRE", "5")):
        monkeypatch.setenv(name, value)
    assert redis_transport_options("tm-x:") == {
        "visibility_timeout": 20, "unacked_restore_interval": 1, "unacked_restore_throttle": 1,
        "unacked_mutex_expire": 5, "global_keyprefix": "tm-x:"}
