"""A harness evaluation run as tokenmill jobs on the Celery fleet (issue 27, part 3): a worker
on Redis, the jobs' request files and results on the SeaweedFS S3 server. The fleet reports
what the embedded ``tokenmill`` model reports on the same engine settings (per-request
log-likelihoods within 1e-4, is_greedy, generations and metrics), a re-run takes every
committed part instead of running it, and a run that lost parts runs only those shards."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fleet_support import REDIS_BROKER, RESULT_BACKEND, Fleet, _make_fleet, _require
from harness_support import TASKS, evaluate, metrics, responses, write_tasks
from pipeline_support import tiny_engine

pytest.importorskip("lm_eval")

from test_harness_model import _summary, assert_same_as_hf  # noqa: E402

from connectors import read_manifest, success_marker_exists, write_file_set  # noqa: E402
from harness.fleet_job import REQUEST_FILES, FleetSettings, job_spec, read_results, run_job  # noqa: E402
from harness.fleet_model import FleetLM  # noqa: E402
from harness.model import TokenmillLM  # noqa: E402
from pipeline.shard_outcome import entry_part_file  # noqa: E402

MAX_LENGTH = 128  # the rolling task's second document spans several windows
SHARD_ROWS = 4  # the 16 multiple-choice requests become 4 shards


@pytest.fixture(scope="module")
def include_path(tmp_path_factory) -> str:
    return write_tasks(tmp_path_factory.mktemp("harness-tasks"))


@pytest.fixture(scope="module")
def engine_args(tiny_model_dir) -> dict[str, Any]:
    """The workers' preloaded engine is the one the jobs ask for (same settings, same key)."""
    return {k: v for k, v in tiny_engine(tiny_model_dir).items() if k != "model"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, seaweedfs_server, tiny_model_dir, engine_args) -> Iterator[Fleet]:
    _require(6379, "Redis")
    if not seaweedfs_server.running:
        seaweedfs_server.start()
    preload = {"model": str(tiny_model_dir), "dtype": "float32", "max_model_len": MAX_LENGTH + 2, **engine_args}
    env = {"TOKENMILL_S3_ENDPOINT_URL": seaweedfs_server.endpoint_url, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "TOKENMILL_PRELOAD_ENGINE": json.dumps(preload)}
    yield from _make_fleet(REDIS_BROKER, tmp_path_factory, tiny_model_dir, env, pool="threads")


_JOB_IDS: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def _forget_job_state() -> Iterator[None]:
    yield
    r = redis.Redis.from_url(RESULT_BACKEND)
    for job_id in _JOB_IDS:
        r.delete(*(f"tokenmill:job:{job_id}:{what}" for what in ("meta", "shards", "cancel")))


@pytest.fixture(scope="module")
def work_dir(seaweedfs_server) -> str:
    return f"s3://{seaweedfs_server.make_bucket(f'tm-evals-{uuid.uuid4().hex[:8]}')}/evals"


def fleet_lm(model_dir: Path, work_dir: str, engine_args: dict[str, Any]) -> FleetLM:
    """As ``lm_eval --model tokenmill --model_args ...,work_dir=...,broker=...`` builds it."""
    args = {"model": str(model_dir), "max_length": MAX_LENGTH, "work_dir": work_dir, "broker": REDIS_BROKER,
            "shard_rows": SHARD_ROWS, "poll_s": 0.2, "timeout_s": 300, "progress": False, **engine_args}
    lm = TokenmillLM.create_from_arg_string(",".join(f"{k}={v}" for k, v in args.items()))
    assert isinstance(lm, FleetLM)
    lm.jobs = _Recorded()
    return lm


class _Recorded(list):
    """``FleetLM.jobs`` that also notes each job id, so its Redis state is removed afterwards."""

    def append(self, run) -> None:
        _JOB_IDS.append(run.job_id)
        super().append(run)


@pytest.fixture(scope="module")
def first_run(fleet, tiny_model_dir, include_path, work_dir, engine_args) -> tuple[FleetLM, dict]:
    fleet.ensure(1)
    lm = fleet_lm(tiny_model_dir, work_dir, engine_args)
    return lm, evaluate(lm, include_path)


def _shards(lm: FleetLM) -> list[tuple[str, int, int]]:
    """(request type, shards run, shards taken as committed) per job of the run."""
    return [(j.what, j.manifest["totals"]["shards_done"], j.manifest["totals"]["shards_skipped"]) for j in lm.jobs]


def test_fleet_run_reports_what_the_embedded_model_reports(first_run, tiny_model_dir, include_path, engine_args):
    lm, result = first_run
    embedded = TokenmillLM(model=str(tiny_model_dir), max_length=MAX_LENGTH, progress=False, **engine_args)
    assert_same_as_hf(_summary(result), _summary(evaluate(embedded, include_path)))
    # one job per harness call: the 16 choices (4 shards), the 4 generations, the rolling windows
    assert _shards(lm) == [("loglikelihood", 4, 0), ("generate_until", 1, 0), ("loglikelihood", 1, 0)]
    for job in lm.jobs:
        manifest = read_manifest(job.output_url)
        assert manifest["mode"] == "celery" and manifest["status"] == "succeeded"
        assert manifest["kind"] == "harness_requests" and manifest["totals"]["errors"] == 0
        assert success_marker_exists(job.output_url)
    mc = lm.jobs[0].manifest["totals"]
    assert mc["rows"] == 16 and mc["cached_prompt_tokens"] > 0  # each question's context, shared by its choices


def test_rerun_takes_every_committed_part(first_run, tiny_model_dir, include_path, work_dir, engine_args):
    _, result = first_run
    again = fleet_lm(tiny_model_dir, work_dir, engine_args)
    rerun = evaluate(again, include_path)
    assert _shards(again) == [("loglikelihood", 0, 4), ("generate_until", 0, 1), ("loglikelihood", 0, 1)]
    for task in TASKS:
        assert responses(rerun, task) == responses(result, task)
        assert metrics(rerun, task) == metrics(result, task)


def test_a_run_that_lost_parts_runs_only_those_shards(first_run, seaweedfs_server, tiny_model_dir, include_path,
                                                      work_dir, engine_args):
    """As a job killed after two of its four shards committed: the rerun computes the other two."""
    lm, result = first_run
    mc = read_manifest(lm.jobs[0].output_url)
    bucket, key = lm.jobs[0].output_url.removeprefix("s3://").split("/", 1)
    lost = [entry_part_file(s) for s in mc["shards"][1:3]]
    for part_file in lost:
        seaweedfs_server.client().delete_object(Bucket=bucket, Key=f"{key}/{part_file}")
    resumed = fleet_lm(tiny_model_dir, work_dir, engine_args)
    rerun = evaluate(resumed, include_path, tasks=("tm_mc",))
    assert _shards(resumed) == [("loglikelihood", 2, 2)]
    ran = [entry_part_file(s) for s in read_manifest(lm.jobs[0].output_url)["shards"] if s["status"] == "done"]
    assert sorted(ran) == sorted(lost)
    for doc, ref_doc in zip(responses(rerun, "tm_mc"), responses(result, "tm_mc"), strict=True):
        for (ll, greedy), (ref_ll, ref_greedy) in zip(doc, ref_doc, strict=True):
            assert abs(ll - ref_ll) <= 1e-4 and greedy == ref_greedy  # recomputed in other batches
    assert metrics(rerun, "tm_mc") == metrics(result, "tm_mc")


def test_a_rerun_waits_for_the_live_job_of_the_same_evaluation(fleet, tiny_model_dir, work_dir, engine_args):
    """The harness killed while its job runs: run again, it waits for that job instead of
    failing on the output's lease. Here the live job sits on a queue no worker reads."""
    lm = fleet_lm(tiny_model_dir, f"{work_dir}-held", engine_args)
    rows = [{"id": "0000000", "text": "loglikelihood", "prompt": [1, 504, 3100], "score_from": 1}]
    spec, files = job_spec("loglikelihood", rows, lm.engine, lm.settings)
    write_file_set(spec.input.url, REQUEST_FILES, files)
    held = f"{spec.name}-held"
    _JOB_IDS.append(held)
    from jobs import api

    api.submit(spec, REDIS_BROKER, job_id=held, queue=f"{fleet.queue}-idle")
    with pytest.raises(TimeoutError, match=f"job {held} still queued after 1.0s"):
        run_job(spec, files, dataclasses.replace(lm.settings, timeout_s=1.0))


def test_without_a_broker_the_job_runs_in_this_process(tiny_model_dir, include_path, tmp_path, engine_args):
    """``work_dir`` alone: the same job, embedded, resumable the same way."""
    args = {"model": str(tiny_model_dir), "max_length": MAX_LENGTH, "work_dir": str(tmp_path / "evals"),
            **engine_args}
    first = TokenmillLM.create_from_arg_obj(args)
    result = evaluate(first, include_path, tasks=("tm_gen",))
    again = TokenmillLM.create_from_arg_obj(args)
    rerun = evaluate(again, include_path, tasks=("tm_gen",))
    assert [j.manifest["mode"] for j in first.jobs] == ["embedded"]
    assert _shards(first) == [("generate_until", 1, 0)] and _shards(again) == [("generate_until", 0, 1)]
    embedded = TokenmillLM(model=str(tiny_model_dir), max_length=MAX_LENGTH, progress=False, **engine_args)
    assert responses(result, "tm_gen") == responses(rerun, "tm_gen") == responses(
        evaluate(embedded, include_path, tasks=("tm_gen",)), "tm_gen")


def test_a_part_with_an_error_row_is_not_kept_for_the_next_run(tiny_model_dir, tmp_path, engine_args):
    """A request that failed raises, and its shard is computed again by the next run instead of
    being taken as committed (which would fail this evaluation for good)."""
    settings = FleetSettings(str(tmp_path / "evals"), None, None, None, 2, None, 0.1)
    rows = [{"id": "0", "text": "loglikelihood", "prompt": [5, 6, 7, 8], "score_from": 2},
            {"id": "1", "text": "loglikelihood", "prompt": [5, 6, 10**9], "score_from": 1},  # past the vocabulary
            {"id": "2", "text": "loglikelihood", "prompt": [9, 8, 7], "score_from": 1}]
    engine = {"model": str(tiny_model_dir), "dtype": "float32", "max_model_len": MAX_LENGTH + 2, **engine_args}
    spec, files = job_spec("loglikelihood", rows, engine, settings)
    for attempt in range(2):
        job_id, manifest = run_job(spec, files, settings)
        ran = sorted(s["index"] for s in manifest["shards"] if s["status"] == "done")
        assert ran == ([0, 1] if attempt == 0 else [0])  # the shard with the bad row, again
        with pytest.raises(RuntimeError, match=r"^tokenmill could not run request 1: row 1: .*runs again"):
            read_results(spec, manifest)


@pytest.mark.parametrize("fleet_args", [{}, {"work_dir": "s3://bucket/evals"}])
def test_both_models_refuse_an_unknown_model_arg(fleet_args):
    with pytest.raises(ValueError, match=r"^tokenmill model: unknown model_args \['max_num_sequences'\]; "
                                         r"engine settings accepted: block_size, "):
        TokenmillLM.create_from_arg_obj({"model": "unused", "max_num_sequences": 8, **fleet_args})
