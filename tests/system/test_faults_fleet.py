"""Faults at the worst moment, on the default configuration: real ``tokenmill worker``
processes (threads pool, two shard tasks each), shards and parts on S3 (moto on loopback).

- kill -9 of a worker holding two shard tasks, on Redis and on RabbitMQ;
- kill -9 of a worker paused between the copy and the delete of a part commit, with the
  S3 server frozen at that moment;
- SIGTERM (spot reclaim, rolling deploy): the worker hands its shards back at once, and
  they complete elsewhere long before the Redis visibility timeout (an hour here) would
  have returned them.

Every test checks that each input id is in the output exactly once (ids, not part names).
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pipeline_support import make_plan, write_uniform_shards
from test_celery_fleet import (  # _forget_job_state: autouse, forgets the ids in _JOB_IDS
    _JOB_IDS,
    JOB_TIMEOUT,
    RABBIT_BROKER,
    REDIS_BROKER,
    Fleet,
    Worker,
    _forget_job_state,  # noqa: F401
    _make_fleet,
    _require,
    wait_until,
)

from connectors import list_shards, part_name, read_manifest, read_parts
from pipeline.fleet import job_status, wait_for_job


@pytest.fixture(scope="module")
def s3_env(s3_server) -> dict[str, str]:
    return {"TOKENMILL_S3_ENDPOINT_URL": s3_server.endpoint_url, "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def pause_dir(tmp_path_factory) -> Path:
    """Workers pause between copy and delete of a commit once this folder exists (armed by a test)."""
    return tmp_path_factory.mktemp("commit-pause") / "armed"


@pytest.fixture(scope="module")
def rabbit_fleet(tmp_path_factory, tiny_model_dir, s3_env, pause_dir) -> Iterator[Fleet]:
    _require(6379, "Redis")
    _require(5672, "RabbitMQ")
    extra = {**s3_env, "TOKENMILL_TEST_PAUSE_COMMIT": str(pause_dir)}
    yield from _make_fleet(RABBIT_BROKER, tmp_path_factory, tiny_model_dir, extra, pool="threads")


@pytest.fixture(scope="module")
def redis_fleet(tmp_path_factory, tiny_model_dir, s3_env) -> Iterator[Fleet]:
    """Visibility timeout 12 s (shards here take 3-6 s on 2 cores): a killed worker's shards come back after it."""
    _require(6379, "Redis")
    extra = {**s3_env, "TOKENMILL_VISIBILITY_TIMEOUT": "12"}
    yield from _make_fleet(REDIS_BROKER, tmp_path_factory, tiny_model_dir, extra, pool="threads")


@pytest.fixture(scope="module")
def redis_graceful_fleet(tmp_path_factory, tiny_model_dir, s3_env) -> Iterator[Fleet]:
    """Visibility timeout one hour: a shard back within the test's 300 s came back by a requeue."""
    _require(6379, "Redis")
    extra = {**s3_env, "TOKENMILL_VISIBILITY_TIMEOUT": "3600", "TOKENMILL_GRACE_PERIOD": "1"}
    yield from _make_fleet(REDIS_BROKER, tmp_path_factory, tiny_model_dir, extra, pool="threads")


def _s3_job(fleet: Fleet, s3_server, bucket: str, model_dir: Path, tag: str, rows: int) -> tuple[Any, list[str]]:
    client = s3_server.client()
    ids = write_uniform_shards(lambda name, data: client.put_object(Bucket=bucket, Key=f"{tag}/in/{name}", Body=data),
                               count=4, rows=rows)
    job_id = f"test-{tag}-{uuid.uuid4().hex[:8]}"
    _JOB_IDS.append(job_id)
    plan = make_plan(f"s3://{bucket}/{tag}/in/", f"s3://{bucket}/{tag}/out", model_dir, job_id=job_id,
                     sampling={"max_tokens": 192, "temperature": 0.0, "ignore_eos": True})
    return plan, ids


def _worker_holding_two(job_id: str, rows: int) -> tuple[int, list[int]] | None:
    """(pid, shard indices) of a worker running two shard tasks of the job, rows already done,
    and none of them past half its rows: a part is committed only once every row of its shard
    is done, so these shards are many decode waves away from a commit."""
    held: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for shard in job_status(job_id)["shards"]:
        if shard["state"] == "running" and shard.get("worker"):
            held[shard["worker"]].append(shard)
    for worker, shards in held.items():
        if (len(shards) >= 2 and any(s["rows_done"] > 0 for s in shards)
                and all(s["rows_done"] <= rows // 2 for s in shards)):
            return int(worker.rsplit(":", 1)[1]), sorted(s["index"] for s in shards)
    return None


def _written_parts(plan, indices: list[int], s3_server) -> list[int]:
    """Those of the shards whose output part exists (committed by whoever ran them)."""
    refs = {r.index: r for r in list_shards(plan.input_url, storage_options=s3_server.storage_options)}
    bucket, prefix = plan.output_url.removeprefix("s3://").split("/", 1)
    listed = s3_server.client().list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/").get("Contents", [])
    names = {o["Key"].rsplit("/", 1)[1] for o in listed}
    return [i for i in indices if part_name(refs[i].part_id) in names]


def _freeze_a_worker_holding_two(fleet: Fleet, plan, job_id: str, rows: int, s3_server) -> tuple[Worker, list[int]]:
    """SIGSTOP a worker that holds two running shards of the job, neither of them written yet.

    Checked while it is frozen (and after the S3 requests it had sent have landed): a worker
    that slipped a commit in between the state poll and the stop is let go, and another moment
    is awaited. So the kill that follows provably loses two unfinished shards, and a part of
    theirs found later was written by another worker."""

    def frozen() -> tuple[Worker, list[int]] | None:
        found = _worker_holding_two(job_id, rows)
        if found is None:
            return None
        worker, held = fleet.by_pid(found[0]), found[1]
        os.killpg(worker.pid, signal.SIGSTOP)
        time.sleep(1)
        if _written_parts(plan, held, s3_server):
            os.killpg(worker.pid, signal.SIGCONT)
            return None
        return worker, held

    return wait_until(frozen, 180, "a worker holding two running shards, none of them written")


def _finished(fleet: Fleet, job_id: str) -> dict[str, Any]:
    try:
        return wait_for_job(job_id, JOB_TIMEOUT, poll_s=0.5)
    except TimeoutError:
        raise AssertionError(f"job {job_id} did not finish: {job_status(job_id)}\n{fleet.logs()}") from None


def _assert_each_id_once(plan, ids: list[str], s3_server) -> None:
    out = read_parts(plan.output_url, storage_options=s3_server.storage_options).column("id").to_pylist()
    assert sorted(out) == sorted(ids) and len(out) == len(set(out))


def _redone_elsewhere(job_id: str, indices: list[int], victim: int, *, duplicates: bool = False) -> None:
    """The shards ended done by another worker. With ``duplicates`` (Redis with a visibility timeout
    shorter than a slow shard) a shard may also end ``skipped``: a second delivery of its message,
    taken while the first copy still ran, found the part current and reported last."""
    ends = ("done", "skipped") if duplicates else ("done",)

    def final() -> dict[int, dict[str, Any]] | None:  # such a second copy may still be about to skip
        shards = {s["index"]: s for s in job_status(job_id)["shards"]}
        return shards if all(shards[i]["state"] in ends for i in indices) else None

    shards = wait_until(final, 60, f"shards {indices} {' or '.join(ends)}")
    for i in indices:
        assert not shards[i]["worker"].endswith(f":{victim}"), shards[i]


def _kill_a_worker_holding_two(fleet: Fleet, s3_server, bucket: str, model_dir: Path, tag: str) -> None:
    fleet.ensure(2)
    rows = 80
    plan, ids = _s3_job(fleet, s3_server, bucket, model_dir, tag, rows=rows)
    job_id = fleet.submit(plan)
    victim, held = _freeze_a_worker_holding_two(fleet, plan, job_id, rows, s3_server)
    victim.kill()  # SIGKILL: no ack, no reject, no cleanup
    status = _finished(fleet, job_id)
    assert status["status"] == "succeeded", fleet.logs()
    _assert_each_id_once(plan, ids, s3_server)
    assert _written_parts(plan, held, s3_server) == held  # written after the kill: by another worker
    manifest = read_manifest(plan.output_url, s3_server.storage_options)
    totals = manifest["totals"]
    assert totals["rows"] == len(ids) and totals["shards_done"] + totals["shards_skipped"] == 4, totals
    _redone_elsewhere(job_id, held, victim.pid, duplicates=fleet.broker_url.startswith("redis"))


def test_kill9_of_a_threads_worker_holding_two_shards_rabbitmq_s3(rabbit_fleet, s3_server, s3_bucket,
                                                                   tiny_model_dir) -> None:
    """RabbitMQ: the dead worker's connection closes and both its shards are requeued at once."""
    _kill_a_worker_holding_two(rabbit_fleet, s3_server, s3_bucket, tiny_model_dir, "kill9-rabbit")


def test_kill9_of_a_threads_worker_holding_two_shards_redis_s3(redis_fleet, s3_server, s3_bucket,
                                                                tiny_model_dir) -> None:
    """Redis: both unacked shards come back after the visibility timeout (12 s here)."""
    _kill_a_worker_holding_two(redis_fleet, s3_server, s3_bucket, tiny_model_dir, "kill9-redis")


def test_worker_killed_between_copy_and_delete_of_a_commit_with_s3_frozen(
    rabbit_fleet, s3_server, s3_bucket, tiny_model_dir, pause_dir
) -> None:
    fleet = rabbit_fleet
    fleet.ensure(2)
    plan, ids = _s3_job(fleet, s3_server, s3_bucket, tiny_model_dir, "copy-delete", rows=40)
    pause_dir.mkdir()  # arm: the first commit of any worker stops after its copy
    job_id = fleet.submit(plan)
    marker = pause_dir / "paused"
    wait_until(marker.exists, 180, "a worker paused between copy and delete")
    paused = json.loads(marker.read_text())
    bucket, key = paused["path"].split("/", 1)
    client = s3_server.client()
    client.head_object(Bucket=bucket, Key=key)  # the part is copied into place
    folder = key.rsplit("/", 1)[0]
    temps = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=f"{folder}/_tmp/")["Contents"]]
    assert temps  # and its temporary is not deleted yet

    s3_server.pause()  # the S3 server freezes at this moment ...
    try:
        fleet.by_pid(paused["pid"]).kill()  # ... and the worker is killed there
        time.sleep(1)
    finally:
        s3_server.resume()

    status = _finished(fleet, job_id)
    assert status["status"] == "succeeded", fleet.logs()
    _assert_each_id_once(plan, ids, s3_server)


def test_sigterm_hands_shards_back_at_once_and_the_job_completes_elsewhere(
    redis_graceful_fleet, s3_server, s3_bucket, tiny_model_dir
) -> None:
    fleet = redis_graceful_fleet
    fleet.ensure(2)
    plan, ids = _s3_job(fleet, s3_server, s3_bucket, tiny_model_dir, "sigterm", rows=100)
    job_id = fleet.submit(plan)
    pid, held = wait_until(lambda: _worker_holding_two(job_id, 100), 180, "a worker holding two running shards")
    victim = fleet.by_pid(pid)
    victim.proc.send_signal(signal.SIGTERM)
    assert victim.proc.wait(timeout=120) == 0, victim.log.read_text()[-3000:]  # a clean warm shutdown
    log = victim.log.read_text()
    assert "worker shutting down" in log and "requeued" in log, log[-3000:]

    status = _finished(fleet, job_id)  # within 300 s: the visibility timeout (3600 s) never came into it
    assert status["status"] == "succeeded", fleet.logs()
    _assert_each_id_once(plan, ids, s3_server)
    handed_back = [i for i in held if f"shard {i}: worker shutting down" in log]
    assert handed_back
    _redone_elsewhere(job_id, handed_back, pid)
    broker = redis.Redis.from_url(REDIS_BROKER)
    prefix = fleet.env["TOKENMILL_REDIS_KEY_PREFIX"]
    assert broker.llen(f"{prefix}{fleet.queue}") == 0 and broker.hlen(f"{prefix}unacked") == 0
