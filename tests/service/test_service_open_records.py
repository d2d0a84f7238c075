"""Work grows with open batches, not all batches (issue 23, point 8): the batch loop and /metrics
use the store's in-memory index of statuses; finished records are not read again, and the
unauthenticated /metrics carries no per-team figure."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tenant_support import KEY_A, KEY_B, RecordingRunner, client, settings_for

import service.records as records
from service.batches import BatchAdvancer
from service.records import BatchRecord, JobRecord
from service.settings import key_id

FINISHED = 40


@pytest.fixture
def reads(monkeypatch):
    """Every record file and folder the store reads, by URL."""
    seen: list[str] = []
    real_json, real_folder = records.read_json, records.read_json_folder

    def read_json(url, options=None):
        seen.append(url)
        return real_json(url, options)

    def read_json_folder(url, options=None):
        seen.append(url + "/")
        return real_folder(url, options)

    monkeypatch.setattr(records, "read_json", read_json)
    monkeypatch.setattr(records, "read_json_folder", read_json_folder)
    return seen


def _batch(i: int, owner: str, status: str, job_id: str | None = None) -> BatchRecord:
    return BatchRecord(id=f"batch_{i:04d}", owner=owner, input_file_id="file-x", endpoint="/v1/completions",
                       completion_window="24h", model="tiny-test", status=status, job_id=job_id,
                       output_url=f"/nowhere/{i}/", request_counts={"total": 1, "completed": 0, "failed": 0})


def test_the_loop_and_metrics_read_only_the_open_records(tmp_path, reads):
    runner = RecordingRunner()
    c = client(settings_for(tmp_path), runner)
    store = c.app.state.store
    for i in range(FINISHED):
        owner = key_id(KEY_A if i % 2 else KEY_B)
        store.put(_batch(i, owner, "completed"))
        store.put(JobRecord(id=f"job-{i}", owner=owner, kind="summarize", name="n", status="succeeded"))
    runner.states["job-open"] = "running"
    store.put(_batch(FINISHED, key_id(KEY_A), "in_progress", job_id="job-open"))
    store.put(JobRecord(id="job-open", owner=key_id(KEY_A), kind="openai_batch", name="b", status="running",
                        batch_id=f"batch_{FINISHED:04d}"))
    advancer = BatchAdvancer(store, runner, c.app.state.settings)
    advancer.tick()  # the first pass may read everything once
    reads.clear()
    for _ in range(5):
        advancer.tick()
    assert not [url for url in reads if url.endswith("/")]  # no folder listed again
    assert reads and all(url.endswith(f"batch_{FINISHED:04d}.json") for url in reads)  # the open batch only

    reads.clear()
    metrics = scrape_text(c)
    assert reads == []
    values = {f"{x.name}{{status=\"{x.labels.get('status')}\"}}": x.value
              for family in text_string_to_metric_families(metrics.text) for x in family.samples}
    assert values['tokenmill_server_batches{status="completed"}'] == FINISHED
    assert values['tokenmill_server_batches{status="in_progress"}'] == 1
    assert values['tokenmill_server_jobs{status="succeeded"}'] == FINISHED
    assert values['tokenmill_server_jobs{status="running"}'] == 1
    for secret in (KEY_A, KEY_B, key_id(KEY_A), key_id(KEY_B), "owner"):
        assert secret not in metrics.text


def test_a_finished_batch_leaves_the_open_set(tmp_path):
    runner = RecordingRunner()
    c = client(settings_for(tmp_path), runner)
    store = c.app.state.store
    store.put(_batch(1, key_id(KEY_A), "cancelling"))
    assert [b.id for b in store.open(BatchRecord)] == ["batch_0001"]
    BatchAdvancer(store, runner, c.app.state.settings).tick()  # no job yet: cancelled at once
    assert store.open(BatchRecord) == [] and store.status_counts(BatchRecord) == {"cancelled": 1}


def scrape_text(c):
    answer = c.get("/metrics")
    assert answer.status_code == 200
    return answer
