"""The batch loop is idempotent (issue 23, point 7): a crash between two of its writes, then a
fresh server over the same storage, never adds a second output or error file record and never
resubmits a live job over its own state."""

from __future__ import annotations

import json

import pytest
from tenant_support import KEY_A, RecordingRunner, auth, client, settings_for

import service.batches as batches
from service.batches import BatchAdvancer
from service.records import BatchRecord, FileRecord, JobRecord, Store


class Crash(BaseException):
    """The process dies here: nothing of the loop catches it."""


class CountingRunner(RecordingRunner):
    def __init__(self) -> None:
        super().__init__()
        self.submits = 0

    def submit(self, plan):
        self.submits += 1
        return super().submit(plan)


def _setup(tmp_path):
    runner = CountingRunner()
    settings = settings_for(tmp_path)
    c = client(settings, runner)
    line = {"custom_id": "r", "method": "POST", "url": "/v1/completions", "body": {"model": "tiny-test", "prompt": "x"}}
    upload = c.post("/v1/files", files={"file": ("in.jsonl", json.dumps(line).encode())}, data={"purpose": "batch"},
                    headers=auth(KEY_A)).json()
    batch = c.post("/v1/batches", json={"input_file_id": upload["id"], "endpoint": "/v1/completions",
                                        "completion_window": "24h"}, headers=auth(KEY_A)).json()
    return runner, settings, c.app.state.store, batch["id"]


def _crash_on_put(store: Store, when) -> None:
    real = store.put

    def put(record):
        if when(record):
            raise Crash
        real(record)

    store.put = put  # type: ignore[method-assign]


def _restart(settings, runner) -> tuple[Store, BatchAdvancer]:
    store = Store(settings.storage_url, settings.storage_options)
    return store, BatchAdvancer(store, runner, settings)


def test_a_crash_after_the_submit_adopts_the_live_job(tmp_path):
    runner, settings, store, batch_id = _setup(tmp_path)
    _crash_on_put(store, lambda r: isinstance(r, JobRecord))  # submitted, not yet recorded
    with pytest.raises(Crash):
        BatchAdvancer(store, runner, settings).tick()
    assert runner.submits == 1 and store.get(BatchRecord, batch_id).job_id is None
    runner.states[batch_id] = "running"  # the live job has started
    store, advancer = _restart(settings, runner)
    advancer.tick()
    batch = store.get(BatchRecord, batch_id)
    assert runner.submits == 1 and runner.states[batch_id] == "running"
    assert (batch.status, batch.job_id) == ("in_progress", batch_id)
    assert store.get(JobRecord, batch_id).batch_id == batch_id


def test_a_crash_inside_finalize_leaves_one_output_and_one_error_file(tmp_path, monkeypatch):
    merged = tmp_path / "merged.jsonl"
    merged.write_text(json.dumps({"custom_id": "a", "response": {"status_code": 200}, "error": None}) + "\n"
                      + json.dumps({"custom_id": "b", "response": None, "error": {"message": "too long"}}) + "\n")
    monkeypatch.setattr(batches, "merge_lines", lambda *args: {"url": str(merged)})
    monkeypatch.setattr(BatchAdvancer, "_parts", lambda self, batch: [])
    runner, settings, store, batch_id = _setup(tmp_path)
    BatchAdvancer(store, runner, settings).tick()
    runner.states[batch_id] = "succeeded"
    _crash_on_put(store, lambda r: isinstance(r, BatchRecord) and r.status == "completed")
    with pytest.raises(Crash):
        BatchAdvancer(store, runner, settings).tick()
    store, advancer = _restart(settings, runner)
    advancer.tick()
    batch = store.get(BatchRecord, batch_id)
    outputs = [f for f in store.all(FileRecord) if f.purpose == "batch_output"]
    assert batch.status == "completed"
    assert sorted(f.filename for f in outputs) == [f"{batch_id}_error.jsonl", f"{batch_id}_output.jsonl"]
    assert {batch.output_file_id, batch.error_file_id} == {f.id for f in outputs}
