"""Two runs on one output cannot mix (issue 23, point 6, its lease part): a run holds the
output's ``_lease.json`` while it writes; a second run is refused naming the first, a stale
lease (its run died) is taken over, and a run that lost its lease writes no manifest and no
``_SUCCESS``. On moto S3, where the lease is taken with an exclusive create."""

from __future__ import annotations

import dataclasses
import time

import pytest
from pipeline_support import jsonl_bytes, make_plan

from connectors import (
    OutputLeased,
    acquire_lease,
    read_lease,
    read_manifest,
    release_lease,
    success_marker_exists,
)
from pipeline.fleet import submit_job
from pipeline.job_runner import run_embedded
from pipeline.shard_outcome import ShardState


def _plan(s3_server, bucket: str, model_dir, job_id: str, shards: int = 2):
    client = s3_server.client()
    for i in range(shards):
        client.put_object(Bucket=bucket, Key=f"in/docs-{i}.jsonl", Body=jsonl_bytes(
            [{"id": f"s{i}-r{r}", "text": f"document {i} row {r}", "lang": "en"} for r in range(2)]))
    return make_plan(f"s3://{bucket}/in/", f"s3://{bucket}/out", model_dir, job_id=job_id,
                     storage_options={"client_kwargs": {"endpoint_url": s3_server.endpoint_url}})  # keys: env


def test_a_second_run_on_a_live_output_is_refused_naming_the_first(s3_server, s3_bucket, tiny_model_dir) -> None:
    first = _plan(s3_server, s3_bucket, tiny_model_dir, "first-run")
    second = dataclasses.replace(first, job_id="second-run")
    refused: list[Exception] = []

    def start_second(outcome) -> None:  # run 2 starts while run 1 is half done
        if outcome.state == ShardState.DONE and not refused:
            lease = read_lease(first.output_url, first.output_options)
            assert lease is not None and lease.run_id == "first-run" and "embedded run" in lease.holder
            for start in (lambda: run_embedded(second, progress=False),
                          lambda: submit_job(second, broker_url="redis://127.0.0.1:1/0")):
                with pytest.raises(OutputLeased) as caught:
                    start()
                refused.append(caught.value)

    manifest = run_embedded(first, progress=False, cross_shard=False, on_progress=start_second)
    assert len(refused) == 2
    for exc in refused:
        assert "is held by run first-run (embedded run on " in str(exc)
    assert manifest["status"] == "succeeded" and success_marker_exists(first.output_url, first.output_options)
    assert read_manifest(first.output_url, first.output_options)["job_id"] == "first-run"
    assert read_lease(first.output_url, first.output_options) is None  # released at the end
    assert run_embedded(second, progress=False)["job_id"] == "second-run"  # now free


def test_a_stale_lease_is_taken_over(s3_server, s3_bucket, tiny_model_dir) -> None:
    plan = _plan(s3_server, s3_bucket, tiny_model_dir, "after-a-crash")
    acquire_lease(plan.output_url, "dead-run", "embedded run on gone pid 1", plan.output_options, ttl_s=60,
                  now=time.time() - 61)
    assert run_embedded(plan, progress=False)["status"] == "succeeded"
    assert read_manifest(plan.output_url, plan.output_options)["job_id"] == "after-a-crash"
    assert read_lease(plan.output_url, plan.output_options) is None

    acquire_lease(plan.output_url, "live-run", "fleet job on elsewhere", plan.output_options, ttl_s=60,
                  now=time.time() - 50)  # 50 s without a heartbeat: still alive
    with pytest.raises(OutputLeased, match=r"held by run live-run \(fleet job on elsewhere\), last heartbeat 5\d s"):
        run_embedded(plan, progress=False)
    assert not release_lease(plan.output_url, "after-a-crash", plan.output_options)  # not its lease
    assert read_lease(plan.output_url, plan.output_options).run_id == "live-run"


def test_a_run_whose_lease_was_taken_over_writes_no_manifest(s3_server, s3_bucket, tiny_model_dir) -> None:
    plan = _plan(s3_server, s3_bucket, tiny_model_dir, "slow-run")
    options = plan.output_options

    def taken_over(outcome) -> None:  # as if run "slow-run" had missed its heartbeats for ttl_s
        if outcome.state == ShardState.DONE and read_lease(plan.output_url, options).run_id == "slow-run":
            release_lease(plan.output_url, "slow-run", options)
            acquire_lease(plan.output_url, "intruder", "fleet job on elsewhere", options)

    with pytest.raises(OutputLeased, match="held by run intruder"):
        run_embedded(plan, progress=False, cross_shard=False, on_progress=taken_over)
    assert read_manifest(plan.output_url, options) is None and not success_marker_exists(plan.output_url, options)
    assert read_lease(plan.output_url, options).run_id == "intruder"  # the loser does not release it
