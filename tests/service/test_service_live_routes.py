"""The live routes as a vLLM user drives them: ``stream=True`` through the stock ``openai`` client
and a raw SSE reader, a client that hangs up mid-stream freeing its sequences, faults mid-stream
ending in an error event, readiness, the vLLM-named latency metrics moving after a request, and
the protocol models reading bodies (unknown fields ignored). Structured replies:
``test_service_live_structured.py``."""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import Future

import httpx2 as httpx
import openai
import pytest
from fastapi.testclient import TestClient
from live_server import live_server
from pipeline_support import wait_until
from prometheus_client.parser import text_string_to_metric_families
from service_stack import MODEL_NAME
from tenant_support import RecordingRunner
from test_service_live_structured import ASK, TOOLS

from service import streaming
from service.app import create_app
from service.settings import ServiceSettings

KEY = "sk-streaming-test"
PROMPTS = ["The quick brown fox", "Numbers: one, two, three,"]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    with live_server(tmp_path_factory.mktemp("streaming"), tiny_model_dir, KEY) as running:
        wait_until(lambda: httpx.get(f"{running.url}/readyz", timeout=5).status_code == 200, 120, "ready")
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=60)


def test_streamed_chat_says_what_the_plain_answer_says(client):
    messages = [{"role": "user", "content": "Say something about the sea."}]
    plain = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=12, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [plain.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == plain.usage.model_dump() | {
        "completion_tokens_details": None, "prompt_tokens_details": None}
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    scored = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=12, temperature=0,
                                            logprobs=True, top_logprobs=2)
    streamed = [e for c in client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=12,
                                                          temperature=0, logprobs=True, top_logprobs=2, stream=True)
                if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in scored.choices[0].logprobs.content]


def test_streamed_completions_keep_choices_apart_and_cut_stop_strings(client):
    plain = client.completions.create(model=MODEL_NAME, prompt=PROMPTS, max_tokens=10, temperature=0.8, seed=7, n=2)
    stream = client.completions.create(model=MODEL_NAME, prompt=PROMPTS, max_tokens=10, temperature=0.8, seed=7, n=2,
                                       stream=True)
    texts: dict[int, str] = {}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert texts == {c.index: c.text for c in plain.choices} and len(texts) == 4
    full = plain.choices[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert len(stop) == 3 and stop.strip()
    cut = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=10, temperature=0.8, seed=7,
                                    stop=[stop])
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=10, temperature=0.8, seed=7, stop=[stop], stream=True))
    assert streamed == cut.choices[0].text and stop not in streamed


def test_raw_event_stream(server):
    body = {"model": MODEL_NAME, "prompt": PROMPTS[1], "max_tokens": 5, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: {") for e in events[:-2])
    assert payloads[-1]["choices"] == [] and payloads[-1]["usage"]["completion_tokens"] == 5
    assert [p["choices"][0]["finish_reason"] for p in payloads[:-1]][-1] == "length"
    assert all(p["usage"] is None for p in payloads[:-1])


def test_a_refused_prompt_is_a_400_before_any_event(server, client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=MODEL_NAME, prompt=[49152], max_tokens=4, stream=True)
    assert exc.value.body["param"] == "prompt" and "outside the vocabulary" in exc.value.body["message"]
    for extra, param in (({"stream_options": {"include_usage": True}, "stream": False}, "stream_options"),
                         ({"stream": True, "logprobs": 1}, "logprobs"), ({"stream": True, "echo": True}, "echo")):
        with pytest.raises(openai.BadRequestError) as exc:
            client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2, **extra)
        assert exc.value.body["param"] == param


def test_a_client_that_hangs_up_frees_its_sequences(server):
    live = server.live
    before = live.aborted
    body = {"model": MODEL_NAME, "prompt": PROMPTS[0], "max_tokens": 900, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"}) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))
    # the connection is closed: the engine aborts the request rather than running its 900 tokens
    wait_until(lambda: live.aborted == before + 1, 60, "the request aborted")
    wait_until(lambda: not live.engine.has_unfinished(), 60, "the engine idle")


def test_a_failure_mid_stream_ends_it_with_an_error_event(server, monkeypatch):
    """A fault after the status line (here the text decoding) is an error event and [DONE], not a
    cut connection, and the call's sequences are aborted."""
    def broken(self, token_ids):
        raise RuntimeError("decoder broke")

    monkeypatch.setattr(streaming._Text, "add", broken)
    live, before = server.live, server.live.aborted
    body = {"model": MODEL_NAME, "messages": ASK, "max_tokens": 900, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"}) as response:
        assert response.status_code == 200
        events = [e for e in response.read().decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2].removeprefix("data: ")) == {"error": {
        "message": "the answer failed: RuntimeError: decoder broke", "type": "server_error", "param": None,
        "code": "engine_error"}}
    assert all('"usage"' not in e or '"usage":null' in e for e in events)  # no usage after a failure
    wait_until(lambda: live.aborted == before + 1, 60, "the request aborted")
    wait_until(lambda: not live.engine.has_unfinished(), 60, "the engine idle")


def test_an_engine_thread_fault_fails_its_calls_and_the_next_ones_run(server, monkeypatch):
    """A fault on the engine thread outside the step's own guard (here the metrics) fails the
    calls in flight, plain and streamed, instead of leaving them waiting; the thread serves on."""
    live = server.live

    def broken(*args):
        raise RuntimeError("metrics broke")

    monkeypatch.setattr(live.metrics, "after_step", broken)
    body = {"model": MODEL_NAME, "messages": ASK, "max_tokens": 8, "temperature": 0}
    headers = {"Authorization": f"Bearer {KEY}"}
    plain = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=20)
    assert plain.status_code == 500 and plain.json()["error"]["message"] == (
        "the engine failed: RuntimeError: metrics broke")
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json={**body, "stream": True}, timeout=20,
                      headers=headers) as response:
        events = [e for e in response.read().decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and "RuntimeError: metrics broke" in events[-2]
    monkeypatch.undo()
    wait_until(lambda: not live.engine.has_unfinished(), 60, "the engine idle")
    assert httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=20).status_code == 200


def test_a_client_gone_before_the_first_chunk_still_cancels_its_call():
    """Starlette may never start the chunk generator (whose ``finally`` cancels the call) when the
    client is gone first; the response itself cancels a call that is still running."""
    class Engine:
        cancelled: list[Future] = []

        def cancel(self, future: Future) -> None:
            self.cancelled.append(future)

    async def lines():
        yield "data: {}\n\n"

    async def gone() -> dict:
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        pass

    engine, call = Engine(), Future()
    asyncio.run(streaming.EventStream(lines(), engine, call)({"type": "http", "asgi": {"spec_version": "2.3"}},
                                                             gone, send))
    assert engine.cancelled == [call]


def _scrape(url: str) -> dict[tuple[str, str], float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {(s.name, s.labels.get("model_name", "")): s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name.startswith("vllm:") and "le" not in s.labels}


def test_latency_metrics_move_after_a_request(server, client):
    before = _scrape(server.url)
    assert before[("vllm:num_requests_running", MODEL_NAME)] == 0  # set once the engine is ready
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
    client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=6, temperature=0)
    after = _scrape(server.url)
    for name in ("vllm:time_to_first_token_seconds_count", "vllm:time_per_output_token_seconds_count",
                 "vllm:e2e_request_latency_seconds_count", "vllm:request_queue_time_seconds_count"):
        assert after[(name, MODEL_NAME)] == before.get((name, MODEL_NAME), 0) + 1, name
    assert after[("vllm:generation_tokens_total", MODEL_NAME)] - before.get(("vllm:generation_tokens_total",
                                                                             MODEL_NAME), 0) == 6
    assert after[("vllm:prefix_cache_queries_total", MODEL_NAME)] > before.get(
        ("vllm:prefix_cache_queries_total", MODEL_NAME), 0)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_hits_total"):
        assert (name, MODEL_NAME) in after
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    labels = {name for family in text_string_to_metric_families(text) if family.name.startswith("vllm:")
              for sample in family.samples for name in sample.labels}
    assert labels == {"model_name", "finished_reason", "le"} and KEY not in text  # per model, never per key


def test_ready_only_once_the_model_is_loaded(tmp_path):
    settings = ServiceSettings(storage_url=str(tmp_path / "s"), api_keys=[KEY], model=str(tmp_path / "no-model"))
    idle = TestClient(create_app(settings, RecordingRunner()))
    assert idle.get("/healthz").status_code == 200
    assert idle.get("/readyz").status_code == 503 and idle.get("/readyz").json()["status"] == "loading"
    assert idle.get("/health").status_code == 503
    with TestClient(create_app(settings, RecordingRunner(), load_model=True)) as loading:
        failed = wait_until(lambda: loading.get("/readyz").json().get("error"), 60, "the load failed")
        assert loading.get("/readyz").status_code == 503 and "no-model" in failed


def test_bodies_are_read_by_the_protocol_models(server, client):
    """One definition per body: the route's schema is the model's, and a shape error names its field."""
    schema = httpx.get(f"{server.url}/openapi.json", headers={"Authorization": f"Bearer {client.api_key}"},
                       timeout=10).json()
    components = schema["components"]["schemas"]
    assert {"CompletionRequest", "ChatCompletionRequest", "Completion", "ChatCompletion"} <= set(components)
    assert "stream_options" in components["ChatCompletionRequest"]["properties"]
    for extra, param, message in (
            ({"prompt": 3}, "prompt", "prompt must be a string, a list of strings, a list of token ids or a list "
                                      "of token-id lists"),
            ({"temperature": "hot"}, "temperature", "temperature: Input should be a valid number"),
            ({"prompt": None}, "prompt", "prompt must be a string, a list of strings, a list of token ids or a "
                                         "list of token-id lists")):
        with pytest.raises(openai.BadRequestError) as exc:
            client.completions.create(**{"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2, **extra})
        assert (exc.value.body["param"], exc.value.body["message"]) == (param, message)
    answer = httpx.post(f"{server.url}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=30,
                        json={"model": MODEL_NAME, "max_tokens": 2, "user": "u1", "metadata": {"a": "b"}, "tools": [],
                              "messages": [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                                           {"role": "user", "content": "Hi"}]})
    assert answer.status_code == 200 and answer.json()["object"] == "chat.completion"


def test_unknown_fields_are_ignored_with_one_warning_naming_them(client, caplog):
    """As ``vllm serve``: a field this server does not know passes, and one warning names it
    (never its value); a known field it cannot honour is still a 400."""
    secret = "value-that-must-not-be-logged"
    with caplog.at_level(logging.WARNING, logger="service.completions"):
        out = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=3, temperature=0,
                                             extra_body={"future_knob": secret, "prompt_cache_key": secret})
        plain = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=3, temperature=0,
                                          extra_body={"future_knob": {"nested": secret}})
    assert out.choices[0].message.content is not None and plain.choices[0].text is not None
    warnings = [r.getMessage() for r in caplog.records if r.name == "service.completions"]
    assert warnings == ["request body fields ignored: 'future_knob', 'prompt_cache_key'",
                        "request body fields ignored: 'future_knob'"]
    assert secret not in caplog.text
    for extra, param in (({"tools": TOOLS, "tool_choice": "auto"}, "tool_choice"), ({"presence_penalty": 1.0},
                                                                                      "presence_penalty")):
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=2, **extra)
        assert exc.value.body["param"] == param
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2, stream=True, echo=True)
    assert exc.value.body["param"] == "echo"
