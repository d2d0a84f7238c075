"""The S3 paths against two real S3 implementations: moto and SeaweedFS.

moto is a Python model of S3; SeaweedFS is an independent server (Go) with its own
listing, ETag, copy and multipart behaviour. A job end to end, a re-run that finds every
part current, and a server that freezes mid-commit run on both. Credentials and the
endpoint come from the environment, as on a worker.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from pipeline_support import expected_ids, make_plan, write_mixed_inputs, write_uniform_shards

from connectors import (
    OutputLeased,
    acquire_lease,
    read_manifest,
    read_parts,
    success_marker_exists,
    write_text,
)
from connectors.storage import S3_ENDPOINT_ENV, filesystem_for
from pipeline.job_runner import run_embedded


@pytest.fixture
def s3(any_s3_server, monkeypatch) -> Any:
    """The server, a fresh bucket on it, and its endpoint in this process's environment."""
    monkeypatch.setenv(S3_ENDPOINT_ENV, any_s3_server.endpoint_url)
    any_s3_server.bucket = any_s3_server.make_bucket(f"tm-{uuid.uuid4().hex[:12]}")
    return any_s3_server


def test_embedded_job_end_to_end_and_rerun(s3, tiny_model_dir) -> None:
    client = s3.client()

    def put(name: str, data: bytes) -> None:
        client.put_object(Bucket=s3.bucket, Key=f"in/{name}", Body=data)

    files = write_mixed_inputs(put)
    uniform = write_uniform_shards(put, count=2, rows=4)
    plan = make_plan(f"s3://{s3.bucket}/in/", f"s3://{s3.bucket}/out", tiny_model_dir, job_id="s3-e2e")
    manifest = run_embedded(plan, progress=False)
    assert manifest["status"] == "succeeded", manifest
    opts = s3.storage_options
    ids = read_parts(plan.output_url, storage_options=opts).column("id").to_pylist()
    assert sorted(ids) == sorted(expected_ids(files) + uniform) and len(ids) == len(set(ids))
    assert success_marker_exists(plan.output_url, storage_options=opts)
    assert read_manifest(plan.output_url, storage_options=opts)["totals"]["rows"] == len(ids)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=s3.bucket, Prefix="out/").get("Contents", [])]
    assert not [k for k in keys if "/_tmp/" in k]  # every commit deleted its temporary

    again = run_embedded(plan, progress=False)  # inputs unchanged: ETags match, nothing recomputed
    assert {s["status"] for s in again["shards"]} == {"skipped"}
    assert sorted(read_parts(plan.output_url, storage_options=opts).column("id").to_pylist()) == sorted(ids)


def test_a_live_lease_refuses_a_second_run(s3) -> None:
    """The exclusive create of an existing lease is refused on both servers (SeaweedFS answers
    412, moto 'exists'): the second run is told which run holds the output."""
    url = f"s3://{s3.bucket}/leased"
    assert acquire_lease(url, "run-a", "first").run_id == "run-a"
    with pytest.raises(OutputLeased, match="held by run run-a"):
        acquire_lease(url, "run-b", "second")


HUNG_SERVER_OPTS = {"config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1, "read_timeout": 1}}


def test_server_frozen_during_a_commit_recovers(s3) -> None:
    """The server stops answering (SIGSTOP) for 2 s while an object is committed (temporary
    write, copy, delete): retried with backoff, it lands whole and no temporary is left."""
    opts = {**s3.storage_options, **HUNG_SERVER_OPTS}
    url = f"s3://{s3.bucket}/out/report.txt"
    text = "".join(f"line {i}\n" for i in range(2000))
    s3.pause()
    timer = threading.Timer(2.0, s3.resume)
    timer.start()
    try:
        write_text(url, text, opts)
    finally:
        timer.join()
    fs, path = filesystem_for(url, opts)
    assert fs.cat_file(path) == text.encode()
    assert not [p for p in fs.find(f"{s3.bucket}/out") if "/_tmp/" in p]
