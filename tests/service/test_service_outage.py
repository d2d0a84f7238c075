"""A short Redis or S3 outage does not fail a batch (issue 23, point 5): the batch loop leaves the
batch as it is, retries with backoff, and only a failed job fails the batch."""

from __future__ import annotations

import errno
import json
import time

import redis
from tenant_support import KEY_A, RecordingRunner, auth, client, settings_for

from service.batches import BatchAdvancer
from service.records import BatchRecord


class _Flaky:
    """Ticks with the store's ``get`` failing as the test says; the test reads the real one."""

    def __init__(self, advancer, store, get) -> None:
        self.advancer, self.store, self.get = advancer, store, get

    def tick(self) -> None:
        real, self.store.get = self.store.get, self.get
        try:
            self.advancer.tick()
        finally:
            self.store.get = real


class FlakyRunner(RecordingRunner):
    """Redis down for the first ``outages`` status calls of each job."""

    def __init__(self, outages: int) -> None:
        super().__init__()
        self.outages = outages

    def status(self, job_id: str) -> dict:
        if self.outages > 0:
            self.outages -= 1
            raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        return super().status(job_id)


def _batch(tmp_path, runner):
    settings = settings_for(tmp_path, poll_s=0.001)
    c = client(settings, runner)
    line = {"custom_id": "r", "method": "POST", "url": "/v1/completions", "body": {"model": "tiny-test", "prompt": "x"}}
    upload = c.post("/v1/files", files={"file": ("in.jsonl", json.dumps(line).encode())}, data={"purpose": "batch"},
                    headers=auth(KEY_A)).json()
    batch = c.post("/v1/batches", json={"input_file_id": upload["id"], "endpoint": "/v1/completions",
                                        "completion_window": "24h"}, headers=auth(KEY_A)).json()
    store = c.app.state.store
    return BatchAdvancer(store, runner, settings), store, batch["id"]


def _tick_until(advancer, store, batch_id, done, ticks=400) -> list[str]:
    seen = []
    read = store.get
    for _ in range(ticks):
        time.sleep(0.005)  # the backoff is poll_s * 2^n: 1 ms, 2 ms, 4 ms...
        advancer.tick()
        seen.append(read(BatchRecord, batch_id).status)
        if done(seen[-1]):
            break
    return seen


def test_a_redis_outage_leaves_the_batch_in_progress(tmp_path):
    runner = FlakyRunner(outages=0)
    advancer, store, batch_id = _batch(tmp_path, runner)
    advancer.tick()  # submits the job
    (job_id,) = runner.plans
    runner.outages = 5
    seen = _tick_until(advancer, store, batch_id, lambda s: runner.outages == 0 and s == "in_progress")
    assert "failed" not in seen and seen[-1] == "in_progress" and runner.outages == 0
    runner.states[job_id] = "failed"  # now the job itself fails: so does the batch
    assert _tick_until(advancer, store, batch_id, lambda s: s == "failed")[-1] == "failed"
    assert store.get(BatchRecord, batch_id).errors == [{"code": "job_failed", "message": "the job failed"}]


def test_a_storage_outage_leaves_the_batch_as_it_is(tmp_path):
    runner = RecordingRunner()
    advancer, store, batch_id = _batch(tmp_path, runner)
    real_get, outages = store.get, [3]

    def flaky_get(cls, record_id, owner=None):
        if cls is BatchRecord and outages[0] > 0:
            outages[0] -= 1
            raise OSError(errno.ETIMEDOUT, "Connection timed out")
        return real_get(cls, record_id, owner)

    seen = _tick_until(_Flaky(advancer, store, flaky_get), store, batch_id, lambda s: s == "in_progress")
    assert outages == [0] and "failed" not in seen and seen[-1] == "in_progress"
    assert len(runner.plans) == 1  # submitted once, after the outage
