"""Checkpoints inside a shard under real faults: ``tokenmill worker`` processes (threads pool),
RabbitMQ, the job state in Redis, shards and parts on S3 (moto on loopback), the tiny model.

- kill -9 of the worker at about 80% of a 5,000-row shard: the redelivered shard takes the
  checkpoint the dead worker left and recomputes only what came after it;
- SIGTERM with a grace period of 0 mid-shard: the worker checkpoints the shard, hands it back,
  and another worker resumes it without computing a committed row again;
- the S3 server frozen between a chunk's write and the checkpoint record's update, and the
  worker killed there: the chunk the record does not name is not trusted.

Every test checks each input id exactly once in the output, the manifest and ``_SUCCESS``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pipeline_support import make_plan, write_uniform_shards
from test_celery_fleet import (  # _forget_job_state: autouse, forgets the ids in _JOB_IDS
    _JOB_IDS,
    JOB_TIMEOUT,
    RABBIT_BROKER,
    Fleet,
    _forget_job_state,  # noqa: F401
    _make_fleet,
    _require,
    wait_until,
)

from connectors import ShardCheckpoint, list_shards, read_manifest, read_parts, success_marker_exists
from pipeline.fleet import job_status, wait_for_job


@pytest.fixture(scope="module")
def pause_dir(tmp_path_factory) -> Path:
    """Workers pause between a chunk and its checkpoint record once this folder exists."""
    return tmp_path_factory.mktemp("checkpoint-pause") / "armed"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, tiny_model_dir, s3_server, pause_dir) -> Iterator[Fleet]:
    _require(6379, "Redis")
    _require(5672, "RabbitMQ")
    extra = {"TOKENMILL_S3_ENDPOINT_URL": s3_server.endpoint_url, "AWS_ACCESS_KEY_ID": "testing",
             "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
             "TOKENMILL_GRACE_PERIOD": "0", "TOKENMILL_TEST_PAUSE_CHECKPOINT": str(pause_dir)}
    yield from _make_fleet(RABBIT_BROKER, tmp_path_factory, tiny_model_dir, extra, pool="threads")


def _job(s3_server, bucket: str, model_dir: Path, tag: str, rows: int, checkpoint_rows: int) -> tuple[Any, list[str]]:
    client = s3_server.client()
    ids = write_uniform_shards(lambda name, data: client.put_object(Bucket=bucket, Key=f"{tag}/in/{name}", Body=data),
                               count=1, rows=rows, words=6)
    job_id = f"test-{tag}-{uuid.uuid4().hex[:8]}"
    _JOB_IDS.append(job_id)
    plan = make_plan(f"s3://{bucket}/{tag}/in/", f"s3://{bucket}/{tag}/out", model_dir, job_id=job_id,
                     sampling={"max_tokens": 4, "temperature": 0.0, "ignore_eos": True},
                     checkpoint_rows=checkpoint_rows, checkpoint_seconds=0)
    return plan, ids


def _in_flight(plan) -> int:
    """The most rows a worker's driver keeps in the engine: twice the engine's max_num_seqs."""
    return 2 * plan.engine_settings["max_num_seqs"]


def _running(job_id: str) -> dict[str, Any] | None:
    (shard,) = job_status(job_id)["shards"]
    return shard if shard["state"] == "running" and shard.get("worker") else None


def _committed(plan, s3_server) -> int:
    """Rows the shard's checkpoint holds now (every chunk checked, as a resumed run checks them)."""
    from pipeline.output_schema import output_schema

    (ref,) = list_shards(plan.input_url, storage_options=s3_server.storage_options)
    cp = ShardCheckpoint(plan.output_url, ref.part_id, plan.part_fingerprint(ref.fingerprint),
                         s3_server.storage_options)
    return max((c.entry.end for c in cp.load(output_schema(plan), False)), default=0)


def _finished(fleet: Fleet, job_id: str) -> dict[str, Any]:
    try:
        return wait_for_job(job_id, JOB_TIMEOUT, poll_s=0.5)
    except TimeoutError:
        raise AssertionError(f"job {job_id} did not finish: {job_status(job_id)}\n{fleet.logs()}") from None


def _exactly_once(fleet: Fleet, plan, ids: list[str], job_id: str, s3_server) -> dict[str, Any]:
    """The job succeeded with every id once; returns the shard's manifest entry."""
    status = _finished(fleet, job_id)
    assert status["status"] == "succeeded", fleet.logs()
    out = read_parts(plan.output_url, storage_options=s3_server.storage_options).column("id").to_pylist()
    assert out == ids  # every id once, in input order
    manifest = read_manifest(plan.output_url, s3_server.storage_options)
    assert manifest["totals"]["rows"] == len(ids) and manifest["totals"]["shards_done"] == 1
    assert success_marker_exists(plan.output_url, s3_server.storage_options)
    (entry,) = manifest["shards"]
    return entry


def test_kill9_at_80_percent_of_a_5000_row_shard_recomputes_one_interval_at_most(
    fleet, s3_server, s3_bucket, tiny_model_dir
) -> None:
    fleet.ensure(2)
    rows, every = 5000, 500
    plan, ids = _job(s3_server, s3_bucket, tiny_model_dir, "ckpt-kill9", rows, every)
    job_id = fleet.submit(plan)

    def frozen() -> tuple[int, int] | None:
        shard = _running(job_id)
        if shard is None or shard["rows_done"] < rows * 8 // 10:
            return None
        pid = int(shard["worker"].rsplit(":", 1)[1])
        os.killpg(pid, signal.SIGSTOP)
        time.sleep(1)  # S3 requests it had sent have landed
        return pid, job_status(job_id)["shards"][0]["rows_done"]

    pid, done = wait_until(frozen, 180, "the worker at 80% of the shard", interval=0.1)
    committed = _committed(plan, s3_server)
    fleet.by_pid(pid).kill()  # SIGKILL: no ack, no checkpoint, no cleanup
    # rows done and not committed: at most one interval plus the rows in flight (rows finish in
    # input order here: every one has the same budget). ``done`` is the worker's last report (at
    # most a second old), so a checkpoint after it may hold more rows than it says.
    assert committed > 0 and done - committed <= every + _in_flight(plan), (done, committed)

    entry = _exactly_once(fleet, plan, ids, job_id, s3_server)
    assert entry["status"] == "done" and not entry["worker"].endswith(f":{pid}")
    assert entry["rows_resumed"] == committed  # computed again: rows - committed, nothing committed


def test_sigterm_with_no_grace_checkpoints_the_shard_and_another_worker_resumes_it(
    fleet, s3_server, s3_bucket, tiny_model_dir
) -> None:
    fleet.ensure(2)
    rows = 3000
    plan, ids = _job(s3_server, s3_bucket, tiny_model_dir, "ckpt-sigterm", rows, 10**6)  # only the drain's
    job_id = fleet.submit(plan)
    shard = wait_until(lambda: (s := _running(job_id)) and s["rows_done"] >= rows // 3 and s, 180,
                       "the shard a third done")
    victim = fleet.by_pid(int(shard["worker"].rsplit(":", 1)[1]))
    victim.proc.send_signal(signal.SIGTERM)
    assert victim.proc.wait(timeout=120) == 0, victim.log.read_text()[-3000:]
    log = victim.log.read_text()
    saved = re.search(r"not finished within the grace period \(handed back, its first (\d+) rows checkpointed\)"
                      r"; requeued", log)
    assert saved, log[-3000:]
    saved_rows = int(saved.group(1))
    assert saved_rows >= shard["rows_done"] - _in_flight(plan)

    entry = _exactly_once(fleet, plan, ids, job_id, s3_server)
    assert entry["rows_resumed"] == saved_rows  # nothing committed was computed again


def test_s3_frozen_between_a_chunk_and_its_record_and_the_worker_killed_there(
    fleet, s3_server, s3_bucket, tiny_model_dir, pause_dir
) -> None:
    fleet.ensure(2)
    plan, ids = _job(s3_server, s3_bucket, tiny_model_dir, "ckpt-freeze", 2400, 300)  # 7 checkpoints to catch
    job_id = fleet.submit(plan)
    wait_until(lambda: _committed(plan, s3_server) > 0, 180, "a first checkpoint")
    pause_dir.mkdir()  # arm: the next checkpoint stops between its chunk and its record
    marker = pause_dir / "paused"
    wait_until(marker.exists, 180, "a worker paused between a chunk and its record")
    paused = json.loads(marker.read_text())
    start, end = (int(x) for x in re.search(r"chunk-(\d+)-(\d+)-", paused["path"]).groups())
    assert start > 0 and _committed(plan, s3_server) == start  # the chunk is written, the record does not name it

    s3_server.pause()  # the S3 server freezes at this moment ...
    try:
        fleet.by_pid(paused["pid"]).kill()  # ... and the worker is killed there
        time.sleep(1)
    finally:
        s3_server.resume()

    entry = _exactly_once(fleet, plan, ids, job_id, s3_server)
    assert entry["rows_resumed"] == start  # the record's chunks taken, the unnamed one recomputed
