"""Smaller tenant guarantees of the service (issue 23, point 10): a lost job's cancel is a 404,
job ids never land on another job's state, metadata is bounded, and the embedded runner
forgets finished jobs."""

from __future__ import annotations

import time

import pytest
from pipeline_support import jsonl_bytes
from tenant_support import KEY_A, KEY_B, RecordingRunner, auth, client, settings_for, spec

from jobs.spec import JobSpec
from pipeline.plan import JobPlan
from service.runners import EmbeddedRunner


def test_cancelling_a_job_whose_state_is_lost_is_a_404(tmp_path):
    runner = RecordingRunner()
    c = client(settings_for(tmp_path), runner)
    job = c.post("/v1/jobs", json=spec("s3://team/in/", "s3://team/out/"), headers=auth(KEY_A)).json()
    runner.states.clear()  # an embedded job before a server restart
    answer = c.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(KEY_A))
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found"


def test_a_job_id_never_lands_on_another_jobs_state(tmp_path, monkeypatch):
    ids = ["tenant-job-00000007", "tenant-job-00000007", "tenant-job-00000008"]
    monkeypatch.setattr(JobSpec, "new_job_id", lambda self: ids.pop(0))  # two teams draw the same id
    runner = RecordingRunner()
    c = client(settings_for(tmp_path), runner)
    first = c.post("/v1/jobs", json=spec("s3://team/in/", "s3://team/out/"), headers=auth(KEY_A)).json()
    second = c.post("/v1/jobs", json=spec("s3://other/in/", "s3://other/out/"), headers=auth(KEY_B)).json()
    assert first["id"] != second["id"]
    assert c.get(f"/v1/jobs/{first['id']}", headers=auth(KEY_A)).json()["output_url"] == "s3://team/out/"
    assert runner.plans[first["id"]].output_url == "s3://team/out/"


@pytest.mark.parametrize(("metadata", "ok"), [({"k" * 64: "v" * 512}, True), ({"k" * 65: "v"}, False),
                                              ({"k": "v" * 513}, False), ({f"k{i}": "v" for i in range(17)}, False)])
def test_batch_metadata_is_bounded(tmp_path, metadata, ok):
    c = client(settings_for(tmp_path))
    line = {"custom_id": "r", "method": "POST", "url": "/v1/completions", "body": {"model": "tiny-test", "prompt": "hi"}}
    upload = c.post("/v1/files", files={"file": ("in.jsonl", jsonl_bytes([line]))}, data={"purpose": "batch"},
                    headers=auth(KEY_A)).json()
    answer = c.post("/v1/batches", json={"input_file_id": upload["id"], "endpoint": "/v1/completions",
                                         "completion_window": "24h", "metadata": metadata}, headers=auth(KEY_A))
    assert answer.status_code == (200 if ok else 400), answer.text
    if not ok:
        assert answer.json()["error"]["param"].startswith("metadata")


def test_the_embedded_runner_forgets_finished_jobs(tmp_path, monkeypatch):
    import pipeline.job_runner as job_runner

    monkeypatch.setattr(job_runner, "run_embedded", lambda plan, **_: {"status": "succeeded"})
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(jsonl_bytes([{"id": "1", "text": "x"}]))
    runner = EmbeddedRunner(keep_finished=2)
    ids = [runner.submit(JobPlan(job_id=f"j{i}", name="n", kind="summarize", input_url=str(tmp_path / "in"),
                                 output_url=str(tmp_path / f"out{i}"))) for i in range(5)]

    def settled() -> bool:
        known = [i for i in ids if _known(runner, i)]
        return known == ids[-2:] and all(runner.status(i)["status"] == "succeeded" for i in known)

    deadline = time.monotonic() + 30
    while not settled():
        assert time.monotonic() < deadline, [(_known(runner, i)) for i in ids]
        time.sleep(0.05)


def _known(runner: EmbeddedRunner, job_id: str) -> bool:
    try:
        runner.status(job_id)
    except KeyError:
        return False
    return True
