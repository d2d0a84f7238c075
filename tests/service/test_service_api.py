"""``tokenmill serve`` end to end with the official ``openai`` client, a real worker on the local
Redis and the worker's Prometheus endpoint; one server and one worker for the session."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import openai
import pytest
from service_stack import MODEL_NAME, REDIS_BROKER, RESULT_BACKEND, chat_line, jsonl, scrape, wait_for

from connectors import read_manifest
from pipeline.celery_app import make_app

pytestmark = pytest.mark.services
JOB_TIMEOUT = 240
LONG_TEXT = "word " * 1500  # longer than the tiny model's 1,024-token context: an error row


@pytest.fixture
def stack(service_stack):
    return service_stack


def client(stack, key: str) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=stack.url + "/v1", max_retries=0, timeout=30)


def wait_batch(c: openai.OpenAI, batch_id: str, statuses: tuple[str, ...], stack) -> openai.types.Batch:
    def done():
        stack.server.check()
        stack.worker.check()
        batch = c.batches.retrieve(batch_id)
        return batch if batch.status in statuses else None

    return wait_for(done, JOB_TIMEOUT, f"batch {batch_id} to reach {statuses}", interval=0.3)


def worker_counts(stack) -> dict[str, float]:
    labels = f'kind="openai_batch",model="{stack.model_label}"'
    m = scrape(stack.metrics_url)
    names = ("rows", "row_errors", "prompt_tokens", "cached_prompt_tokens", "output_tokens")
    out = {n: m.get(f"tokenmill_{n}_total{{{labels}}}", 0.0) for n in names}
    out["shards_done"] = m.get(f'tokenmill_shards_total{{{labels},outcome="done"}}', 0.0)
    out["steps"] = m.get(f"tokenmill_engine_step_duration_seconds_count{{{labels}}}", 0.0)
    return out


def test_batch_end_to_end_output_and_error_files_and_worker_metrics(stack):
    c = client(stack, stack.keys[0])
    ids = [f"req-{i}" for i in range(10)]
    lines = [chat_line(i, f"Say something about the number {n}.") for n, i in enumerate(ids)]
    lines[3] = chat_line(ids[3], LONG_TEXT)
    lines[7] = chat_line(ids[7], LONG_TEXT)
    upload = c.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
    assert (upload.object, upload.purpose, upload.bytes, upload.filename) == ("file", "batch", len(jsonl(lines)),
                                                                                "requests.jsonl")
    assert c.files.retrieve(upload.id).id == upload.id
    before = worker_counts(stack)
    batch = c.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h",
                             metadata={"owner": "test"})
    assert batch.status == "validating" and batch.request_counts.total == 10 and batch.metadata == {"owner": "test"}
    seen = [before]
    deadline = time.monotonic() + JOB_TIMEOUT
    while (final := c.batches.retrieve(batch.id)).status not in ("completed", "failed"):
        seen.append(worker_counts(stack))  # scraped from the live worker while the batch runs
        assert time.monotonic() < deadline, f"batch still {final.status}"
        stack.worker.check()
        time.sleep(0.2)
    after = worker_counts(stack)
    seen.append(after)
    assert final.status == "completed", final.errors
    assert final.in_progress_at <= final.finalizing_at <= final.completed_at
    assert (final.request_counts.total, final.request_counts.completed, final.request_counts.failed) == (10, 8, 2)

    out = [json.loads(x) for x in c.files.content(final.output_file_id).text.splitlines()]
    err = [json.loads(x) for x in c.files.content(final.error_file_id).text.splitlines()]
    assert Counter(x["custom_id"] for x in out + err) == Counter(ids)  # every custom_id exactly once
    assert sorted(x["custom_id"] for x in err) == ["req-3", "req-7"]
    for x, row in zip(sorted(err, key=lambda x: x["custom_id"]), (3, 7), strict=True):
        assert x["response"] is None
        assert x["error"]["message"] == f"row {row}: prompt is 1531 tokens, the model's context is 1024 tokens"
    for x in out:
        assert x["error"] is None and x["response"]["status_code"] == 200
        assert x["response"]["body"]["object"] == "chat.completion"
    assert c.files.retrieve(final.output_file_id).purpose == "batch_output"

    # the counters moved, never backwards, and their increase is the manifest's totals
    totals = read_manifest(str(stack.storage / "outputs" / batch.id))["totals"]
    for a, b in zip(seen, seen[1:], strict=False):
        assert all(b[k] >= a[k] for k in a)
    assert after["rows"] - before["rows"] == totals["rows"] == 10
    assert after["row_errors"] - before["row_errors"] == totals["errors"] == 2
    for name in ("prompt_tokens", "cached_prompt_tokens", "output_tokens"):
        assert after[name] - before[name] == totals[name], name
    assert totals["output_tokens"] > 0 and after["shards_done"] - before["shards_done"] == 1
    assert after["steps"] > before["steps"]
    m = scrape(stack.metrics_url)
    labels = f'kind="openai_batch",model="{stack.model_label}"'
    assert m[f"tokenmill_kv_blocks{{{labels}}}"] == 512
    assert f"tokenmill_running_sequences{{{labels}}}" in m and f"tokenmill_prefix_cache_hits_total{{{labels}}}" in m

    server = scrape(stack.url + "/metrics")
    assert server['tokenmill_server_batches{status="completed"}'] >= 1
    assert server['tokenmill_server_jobs{status="succeeded"}'] >= 1  # row errors do not fail a job
    listed = c.batches.list(limit=100)
    assert batch.id in [b.id for b in listed.data]


def test_a_second_key_sees_none_of_the_first_keys_objects(stack):
    a, b = client(stack, stack.keys[0]), client(stack, stack.keys[1])
    upload = a.files.create(file=("x.jsonl", jsonl([chat_line("only", "hello")])), purpose="batch")
    batch = a.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        b.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        b.batches.cancel(batch.id)
    with pytest.raises(openai.NotFoundError):
        b.files.retrieve(upload.id)
    with pytest.raises(openai.NotFoundError):
        b.files.content(upload.id)
    with pytest.raises(openai.NotFoundError):
        b.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.id not in [x.id for x in b.batches.list().data]
    done = wait_batch(a, batch.id, ("completed", "failed"), stack)
    with stack.http(stack.keys[1]) as http:
        assert http.get(f"/v1/jobs/{done.tokenmill_job_id}").status_code == 404
        assert http.get(f"/v1/files/{done.output_file_id}/content").status_code == 404
    with stack.http() as anonymous:
        response = anonymous.get(f"/v1/batches/{batch.id}")
        assert response.status_code == 401 and response.json()["error"]["code"] == "missing_api_key"
    with pytest.raises(openai.AuthenticationError):
        client(stack, "not-a-key").batches.list()


def test_bad_input_is_a_400_naming_the_line_or_field(stack):
    c = client(stack, stack.keys[0])
    bad_json = jsonl([chat_line("a", "fine")]) + b'{"custom_id": "b", "method": \n'
    with pytest.raises(openai.BadRequestError) as exc:
        c.files.create(file=("bad.jsonl", bad_json), purpose="batch")
    assert "line 2: malformed JSON" in exc.value.message

    missing = jsonl([chat_line("a", "fine"), {"method": "POST", "url": "/v1/chat/completions", "body": {}}])
    with pytest.raises(openai.BadRequestError) as exc:
        c.files.create(file=("missing.jsonl", missing), purpose="batch")
    assert "line 2: custom_id must be a non-empty string" in exc.value.message
    assert exc.value.body["param"] == "custom_id"

    wrong_model = c.files.create(file=("m.jsonl", jsonl([chat_line("a", "x"), chat_line("b", "y", model="gpt-9")])),
                                 purpose="batch")
    with pytest.raises(openai.BadRequestError) as exc:
        c.batches.create(input_file_id=wrong_model.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert f"line 2: unknown model 'gpt-9'; this server serves '{MODEL_NAME}'" in exc.value.message
    assert exc.value.body["param"] == "body.model"

    with pytest.raises(openai.BadRequestError) as exc:
        c.batches.create(input_file_id=wrong_model.id, endpoint="/v1/images", completion_window="24h")
    assert exc.value.body["param"] == "endpoint" and "unknown endpoint '/v1/images'" in exc.value.message

    with stack.http(stack.keys[0]) as http:
        response = http.post("/v1/batches", json={"endpoint": "/v1/chat/completions", "completion_window": "24h"})
        assert response.status_code == 400
        assert response.json()["error"] == {"message": "Missing required parameter: 'input_file_id'.",
                                            "type": "invalid_request_error", "param": "input_file_id",
                                            "code": "missing_required_parameter"}
    with pytest.raises(openai.APIStatusError) as exc:  # the server was started with --max-upload-mb 1
        c.files.create(file=("big.jsonl", jsonl([chat_line("big", "w " * 600_000)])), purpose="batch")
    assert exc.value.status_code == 413 and exc.value.body["code"] == "file_too_large"


def test_cancel_mid_batch(stack):
    c = client(stack, stack.keys[0])
    ids = [f"long-{i}" for i in range(48)]
    upload = c.files.create(file=("long.jsonl", jsonl([chat_line(i, f"Tell a long story {i}.", max_tokens=200)
                                                       for i in ids])), purpose="batch")
    batch = c.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    running = wait_batch(c, batch.id, ("in_progress", "finalizing", "completed"), stack)
    assert running.status == "in_progress"
    cancelling = c.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    final = wait_batch(c, batch.id, ("cancelled", "completed", "failed"), stack)
    assert final.status == "cancelled" and final.cancelled_at >= final.cancelling_at
    assert final.request_counts.completed < 48
    if final.output_file_id:  # rows of the shard finished before the cancel, each once
        out = [json.loads(x)["custom_id"] for x in c.files.content(final.output_file_id).text.splitlines()]
        assert len(out) == len(set(out)) and set(out) <= set(ids)
    with pytest.raises(openai.BadRequestError):
        done = c.files.create(file=("one.jsonl", jsonl([chat_line("one", "hi")])), purpose="batch")
        finished = wait_batch(c, c.batches.create(input_file_id=done.id, endpoint="/v1/chat/completions",
                                                  completion_window="24h").id, ("completed",), stack)
        c.batches.cancel(finished.id)


def test_celery_task_events_show_the_shard_tasks(stack):
    """What Flower and `celery events` see: the worker's heartbeats and a shard task's life."""
    app = make_app(REDIS_BROKER, RESULT_BACKEND, stack.queue, stack.prefix)
    events: list[dict] = []
    with app.connection_for_read() as conn:
        receiver = app.events.Receiver(conn, handlers={"*": events.append})
        thread = threading.Thread(target=receiver.capture, kwargs={"limit": None, "timeout": None, "wakeup": False},
                                  daemon=True)
        thread.start()
        try:
            wait_for(lambda: any(e["type"] == "worker-heartbeat" for e in events), 30, "a worker heartbeat")
            c = client(stack, stack.keys[0])
            upload = c.files.create(file=("ev.jsonl", jsonl([chat_line("ev", "hello")])), purpose="batch")
            batch = c.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                     completion_window="24h")
            assert wait_batch(c, batch.id, ("completed", "failed"), stack).status == "completed"

            def shard_task() -> set[str] | None:
                names = {e["uuid"]: e["name"] for e in events if e["type"] in ("task-sent", "task-received")}
                ids = [u for u, n in names.items() if n == "tokenmill.process_shard"]
                for uuid in ids:
                    seen = {e["type"] for e in events if e.get("uuid") == uuid}
                    if {"task-received", "task-started", "task-succeeded"} <= seen:
                        return seen
                return None

            seen = wait_for(shard_task, 30, "the shard task's events")
            assert "task-sent" in seen  # sent by the server when it submitted the batch's job
        finally:
            receiver.should_stop = True
            thread.join(timeout=10)


def test_completions_batch_uses_the_raw_prompt(stack, tiny_model_dir):
    """/v1/completions: the prompt is tokenized as is (no chat template); text_completion bodies."""
    from transformers import AutoTokenizer

    c = client(stack, stack.keys[0])
    prompts = {f"c-{i}": f"Once upon a time, number {i}," for i in range(3)}
    lines = [{"custom_id": k, "method": "POST", "url": "/v1/completions",
              "body": {"model": MODEL_NAME, "prompt": p, "max_tokens": 5}} for k, p in prompts.items()]
    upload = c.files.create(file=("completions.jsonl", jsonl(lines)), purpose="batch")
    with pytest.raises(openai.BadRequestError) as exc:  # the lines post to the other endpoint
        c.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert "line 1: url '/v1/completions' does not match the batch endpoint" in exc.value.message
    batch = c.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
    done = wait_batch(c, batch.id, ("completed", "failed"), stack)
    assert done.status == "completed" and done.request_counts.completed == 3
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    out = [json.loads(x) for x in c.files.content(done.output_file_id).text.splitlines()]
    assert sorted(x["custom_id"] for x in out) == sorted(prompts)
    for x in out:
        body = x["response"]["body"]
        assert body["object"] == "text_completion" and body["choices"][0]["logprobs"] is None
        assert body["usage"]["prompt_tokens"] == len(tokenizer.encode(prompts[x["custom_id"]]))
        assert body["usage"]["completion_tokens"] == 5


def test_a_batch_running_across_a_server_restart_completes_and_lists_page_by_page(stack):
    """Batch and file records live in the storage and job state in Redis: a new server process
    picks the running batch up. Lists page with ``after``/``limit`` (the client follows them)."""
    c = client(stack, stack.keys[1])
    ids = [f"r-{i}" for i in range(16)]
    upload = c.files.create(file=("restart.jsonl", jsonl([chat_line(i, f"Count to {i}.", max_tokens=48)
                                                          for i in ids])), purpose="batch")
    batch = c.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_batch(c, batch.id, ("in_progress", "finalizing", "completed"), stack)
    stack.restart_server()
    done = wait_batch(c, batch.id, ("completed", "failed", "cancelled"), stack)
    assert done.status == "completed" and done.request_counts.completed == 16
    out = [json.loads(x)["custom_id"] for x in c.files.content(done.output_file_id).text.splitlines()]
    assert sorted(out) == sorted(ids)

    for name in ("a", "b", "c"):
        c.files.create(file=(f"{name}.jsonl", jsonl([chat_line(name, "x")])), purpose="batch")
    every = c.files.list(limit=100)
    # key B's files (only this test uses key B): its input, the batch's output file and these three
    assert every.has_more is False and len(every.data) == 5
    first = c.files.list(limit=2)
    assert first.has_more is True and [f.id for f in first.data] == [f.id for f in every.data[:2]]
    paged = [f.id for f in c.files.list(limit=2)]  # auto-pagination: after=<last id> page by page
    assert paged == [f.id for f in every.data]
    assert [b.id for b in c.batches.list(limit=1)] == [b.id for b in c.batches.list(limit=100).data]
