"""Exactly once across re-runs: the ``_SUCCESS`` marker describes one run, parts keep their
identity when other inputs come and go, stale parts never duplicate rows, and a shard that
will be retried never looks final to the finalizer."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import redis
from pipeline_support import jsonl_bytes, local_put, make_plan, tiny_engine, write_uniform_shards

from connectors import (
    PartWriter,
    list_shards,
    read_manifest,
    read_parts,
    success_marker_exists,
    write_success_marker,
)
from jobs.api import run
from jobs.spec import JobSpec
from pipeline.job_runner import run_embedded
from pipeline.job_state import JobStateStore

REDIS_BROKER = "redis://127.0.0.1:6379/0"
RESULT_BACKEND = "redis://127.0.0.1:6379/1"


def _require_redis() -> None:
    try:
        redis.Redis.from_url(REDIS_BROKER, socket_connect_timeout=2).ping()
    except redis.RedisError:
        pytest.skip("Redis is not reachable on 127.0.0.1:6379")


def _docs(name: str, count: int = 3) -> list[dict[str, str]]:
    return [{"id": f"{name}{i}", "text": f"document {i} of file {name}", "lang": "en"} for i in range(count)]


def _folder_ids(out: Path) -> Counter:
    """Every row of every part file in the folder, as a reader globbing ``part-*.parquet`` sees it."""
    return Counter(i for p in sorted(out.glob("part-*.parquet")) for i in pq.read_table(p).column("id").to_pylist())


def _spec(tmp_path: Path, model_dir: Path, **output: Any) -> JobSpec:
    return JobSpec.from_dict({
        "name": "reruns", "input": {"url": "in/", "id_field": "id", "passthrough": ["lang"]},
        "output": {"url": "out/", "openai_format": True, **output},
        "model": {k if k != "model" else "path": v for k, v in tiny_engine(model_dir).items()},
        "sampling": {"max_tokens": 2, "ignore_eos": True},
    }, base_dir=tmp_path)


# ---- 1: _SUCCESS --------------------------------------------------------------------------------


def test_a_rerun_removes_the_old_success_marker_before_it_replaces_a_part(tmp_path: Path, tiny_model_dir,
                                                                        monkeypatch) -> None:
    """Run 1 succeeds; the input changes and gains a corrupt shard. Run 2 commits its replaced
    part with no ``_SUCCESS`` in place, ends completed_with_errors, and writes no marker."""
    inp, out = tmp_path / "in", tmp_path / "out"
    write_uniform_shards(local_put(inp), count=2, rows=2)
    plan = make_plan(str(inp), str(out), tiny_model_dir)
    assert run_embedded(plan, progress=False)["status"] == "succeeded"
    assert success_marker_exists(plan.output_url)

    local_put(inp)("shard-000.jsonl", jsonl_bytes(_docs("changed", 2)))  # its part will be replaced
    (inp / "z.parquet").write_bytes(b"PAR1 not really parquet")
    marker_at_commit = []
    commit = PartWriter.commit

    def watched_commit(self, metadata=None):
        marker_at_commit.append(success_marker_exists(plan.output_url))
        return commit(self, metadata)

    monkeypatch.setattr(PartWriter, "commit", watched_commit)
    manifest = run_embedded(plan, progress=False)
    assert manifest["status"] == "completed_with_errors"
    assert (manifest["totals"]["shards_done"], manifest["totals"]["shards_skipped"]) == (1, 1)
    assert marker_at_commit == [False]
    assert not success_marker_exists(plan.output_url)
    assert read_manifest(plan.output_url)["success_marker"] is False


def test_submit_removes_the_old_success_marker_before_anything_is_queued(tmp_path: Path, tiny_model_dir) -> None:
    """The fleet: ``submit_job`` deletes the marker before it queues a shard (no worker runs here)."""
    _require_redis()
    from pipeline.fleet import submit_job

    inp, out = tmp_path / "in", tmp_path / "out"
    write_uniform_shards(local_put(inp), count=1, rows=1)
    run_id = uuid.uuid4().hex[:10]
    queue, prefix = f"tm-test-{run_id}", f"tm-test-{run_id}:"
    plan = make_plan(str(inp), str(out), tiny_model_dir, job_id=f"test-marker-{run_id}")
    write_success_marker(plan.output_url)
    try:
        submit_job(plan, REDIS_BROKER, result_backend=RESULT_BACKEND, queue=queue, redis_key_prefix=prefix)
        assert not success_marker_exists(plan.output_url)
    finally:
        _forget(prefix, plan.job_id)


def _forget(prefix: str, job_id: str) -> None:
    broker = redis.Redis.from_url(REDIS_BROKER)
    for key in broker.scan_iter(f"{prefix}*"):
        broker.delete(key)
    state = redis.Redis.from_url(RESULT_BACKEND)
    state.delete(*(f"tokenmill:job:{job_id}:{what}" for what in ("meta", "shards", "cancel")))


# ---- 2: part identity and stale parts ---------------------------------------------------------


def test_deleting_an_input_leaves_every_remaining_row_once(tmp_path: Path, tiny_model_dir) -> None:
    """a, b, c; delete b and re-run: c's rows once in the folder, in the manifest's parts and in
    the merged output.jsonl, and c is not recomputed."""
    for name in "abc":
        local_put(tmp_path / "in")(f"{name}.jsonl", jsonl_bytes(_docs(name)))
    spec = _spec(tmp_path, tiny_model_dir)
    assert run(spec, job_id="run1", progress=False)["status"] == "succeeded"
    out = tmp_path / "out"
    assert _folder_ids(out) == Counter(f"{n}{i}" for n in "abc" for i in range(3))

    (tmp_path / "in/b.jsonl").unlink()
    manifest = run(spec, job_id="run2", progress=False)
    expected = [f"{n}{i}" for n in "ac" for i in range(3)]
    assert _folder_ids(out) == Counter(expected)  # b's part is gone, c's is there once
    merged = [json.loads(line)["custom_id"] for line in (out / "output.jsonl").read_text().splitlines()]
    assert merged == expected
    assert read_parts(str(out)).column("id").to_pylist() == expected
    assert manifest["status"] == "succeeded"
    assert (manifest["totals"]["shards_done"], manifest["totals"]["shards_skipped"]) == (0, 2)
    assert sorted(p.name for p in out.glob("part-*")) == sorted(
        f"part-{s.part_id}.{ext}" for s in list_shards(str(tmp_path / "in")) for ext in ("parquet", "jsonl"))
    assert manifest["parts"] == [f"part-{s.part_id}.parquet" for s in list_shards(str(tmp_path / "in"))]


def test_a_part_id_depends_on_its_shard_alone(tmp_path: Path) -> None:
    from connectors import ShardRef

    for name in "bc":
        local_put(tmp_path)(f"{name}.jsonl", jsonl_bytes(_docs(name, 1)))
    before = {s.basename[0]: (s.index, s.part_id) for s in list_shards(str(tmp_path))}
    local_put(tmp_path)("a.jsonl", jsonl_bytes(_docs("a", 1)))
    after = {s.basename[0]: (s.index, s.part_id) for s in list_shards(str(tmp_path))}
    assert [after[n][0] for n in "bc"] == [1, 2] and [before[n][0] for n in "bc"] == [0, 1]  # indices move
    assert [after[n][1] for n in "bc"] == [before[n][1] for n in "bc"]  # part ids do not
    whole = ShardRef(0, "http://user:pw@host/x.parquet", "parquet", None)
    assert whole.part_id == ShardRef(7, "http://host/x.parquet", "parquet", None).part_id  # no credentials in it
    groups = {ShardRef(i, "s3://b/x.parquet", "parquet", None, row_group=i).part_id for i in range(3)}
    assert len(groups | {ShardRef(0, "s3://b/x.parquet", "parquet", None).part_id}) == 4


def test_a_new_input_that_sorts_first_is_the_only_one_computed(tmp_path: Path, tiny_model_dir) -> None:
    for name in "bc":
        local_put(tmp_path / "in")(f"{name}.jsonl", jsonl_bytes(_docs(name)))
    spec = _spec(tmp_path, tiny_model_dir)
    assert run(spec, job_id="night1", progress=False)["totals"]["shards_done"] == 2

    local_put(tmp_path / "in")("a.jsonl", jsonl_bytes(_docs("a")))
    manifest = run(spec, job_id="night2", progress=False)
    by_name = {s["url"].rsplit("/", 1)[1]: s["status"] for s in manifest["shards"]}
    assert by_name == {"a.jsonl": "done", "b.jsonl": "skipped", "c.jsonl": "skipped"}
    expected = [f"{n}{i}" for n in "abc" for i in range(3)]
    assert _folder_ids(tmp_path / "out") == Counter(expected)
    merged = [json.loads(line)["custom_id"] for line in (tmp_path / "out/output.jsonl").read_text().splitlines()]
    assert merged == expected


# ---- 3: a shard that will be retried is not final -------------------------------------------------


def test_a_shard_failing_transiently_is_retrying_not_failed_for_the_finalizer(tmp_path: Path, tiny_model_dir,
                                                                              monkeypatch) -> None:
    """Shard 1's first attempt hits a transient storage error and its task will retry. A
    finalizer fired early by a duplicate of shard 0 must wait for it, not report the job
    completed_with_errors while the retry goes on to commit the part."""
    _require_redis()
    from celery.exceptions import Retry

    import pipeline.shard_opening as shard_opening
    from pipeline.fleet import job_status
    from pipeline.output_lease import FLEET_TTL_S, take_output
    from pipeline.tasks import finalize_job, process_shard

    inp, out = tmp_path / "in", tmp_path / "out"
    ids = write_uniform_shards(local_put(inp), count=2, rows=2)
    plan = make_plan(str(inp), str(out), tiny_model_dir, job_id=f"test-retrying-{uuid.uuid4().hex[:8]}")
    shards = list_shards(plan.input_url)
    store = JobStateStore()
    store.init_job(plan.job_id, {"name": plan.name, "submitted_at": time.time()}, [s.to_dict() for s in shards])
    take_output(plan, "fleet job", FLEET_TTL_S)  # what submit does
    try:
        first = process_shard(plan.to_dict(), shards[0].to_dict())
        reader = shard_opening.read_records

        def flaky(ref, **kwargs):
            if ref.index == 1:
                raise ConnectionError("injected: connection reset by the object store")
            return reader(ref, **kwargs)

        monkeypatch.setattr(shard_opening, "read_records", flaky)
        with pytest.raises(Retry):
            process_shard(plan.to_dict(), shards[1].to_dict())
        indices = [s.index for s in shards]
        with pytest.raises(Retry):  # the chord counted shard 0 twice and fired: the finalizer waits
            finalize_job([first, first], plan.to_dict(), shard_indices=indices)
        assert read_manifest(plan.output_url) is None and not success_marker_exists(plan.output_url)
        assert store.shards(plan.job_id)[1]["state"] == "retrying"
        assert job_status(plan.job_id)["status"] == "running"

        monkeypatch.setattr(shard_opening, "read_records", reader)
        assert process_shard(plan.to_dict(), shards[1].to_dict())["status"] == "done"  # the retry
        done = finalize_job([first, first], plan.to_dict(), shard_indices=indices)
        assert done["status"] == "succeeded" and done["totals"]["rows"] == len(ids)
        assert success_marker_exists(plan.output_url)
    finally:
        store.redis.delete(*(f"tokenmill:job:{plan.job_id}:{what}" for what in ("meta", "shards", "cancel")))


def test_the_fleet_finalizer_removes_parts_of_inputs_that_are_gone(tmp_path: Path, tiny_model_dir) -> None:
    """In-process tasks: run 1 over two shards, delete one input, run 2's finalizer leaves
    only the remaining shard's part and lists it as the job's only part."""
    _require_redis()
    from pipeline.output_lease import FLEET_TTL_S, take_output
    from pipeline.tasks import finalize_job, process_shard

    inp, out = tmp_path / "in", tmp_path / "out"
    write_uniform_shards(local_put(inp), count=2, rows=2)
    store = JobStateStore()
    job_ids = []
    try:
        for run_number in (1, 2):
            if run_number == 2:
                (inp / "shard-000.jsonl").unlink()
            plan = make_plan(str(inp), str(out), tiny_model_dir, job_id=f"test-stale-{uuid.uuid4().hex[:8]}")
            job_ids.append(plan.job_id)
            shards = list_shards(plan.input_url)
            store.init_job(plan.job_id, {"name": plan.name, "submitted_at": time.time()},
                           [s.to_dict() for s in shards])
            take_output(plan, "fleet job", FLEET_TTL_S)  # what submit does
            results = [process_shard(plan.to_dict(), s.to_dict()) for s in shards]
            done = finalize_job(results, plan.to_dict(), shard_indices=[s.index for s in shards],
                                shard_parts=[s.part_id for s in shards])
            assert done["status"] == "succeeded"
        manifest = read_manifest(plan.output_url)
        assert manifest["parts"] == [f"part-{shards[0].part_id}.parquet"] and len(manifest["removed_parts"]) == 1
        assert _folder_ids(out) == Counter(["s1-r0", "s1-r1"])
    finally:
        for job_id in job_ids:
            store.redis.delete(*(f"tokenmill:job:{job_id}:{what}" for what in ("meta", "shards", "cancel")))


def test_stale_part_removal_touches_only_part_files_the_pipeline_writes(tmp_path: Path) -> None:
    from connectors import remove_stale_parts

    keep, gone = "0123456789abcdef", "fedcba9876543210"
    names = [f"part-{keep}.parquet", f"part-{keep}.jsonl", f"part-{gone}.parquet", f"part-{gone}.jsonl",
             "part-00003.parquet", "part-0.jsonl", "part-notes.txt", "_manifest.json", "output.jsonl"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    removed = remove_stale_parts(str(tmp_path), [keep])
    assert removed == ["part-00003.parquet", f"part-{gone}.jsonl", f"part-{gone}.parquet"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(set(names) - set(removed))
