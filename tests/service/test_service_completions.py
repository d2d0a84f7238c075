"""Synchronous ``/v1/completions`` and ``/v1/chat/completions`` of a live ``tokenmill serve``: the
``openai`` client's calls answered with HF transformers' greedy tokens and log-probabilities,
every prompt form, echo with max_tokens 0 and 1, concurrent requests on the one engine, the
service's keys and limits; and lm-evaluation-harness's ``local-completions`` model against it
reporting what the embedded ``tokenmill`` model reports."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import openai
import pytest
import torch
from engine_cases import hf_greedy, hf_model
from harness_support import TASKS, evaluate, metrics, responses, write_tasks
from service_stack import MODEL_NAME, free_port
from test_service_embedded import _serve
from transformers import AutoTokenizer

KEY = "sk-completions-test"
PROMPTS = ["The quick brown fox", "Numbers: one, two, three,"]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    port = free_port()
    proc = _serve(tmp_path_factory.mktemp("completions"), tiny_model_dir, port, KEY, "serve.log")
    yield f"http://127.0.0.1:{port}"
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _hf_prompt_logprobs(model_dir, ids: list[int]) -> list[float]:
    model = hf_model(str(model_dir))
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return [lp[i - 1, ids[i]].item() for i in range(1, len(ids))]


def test_every_prompt_form_matches_hf_greedy(client, tokenizer, tiny_model_dir):
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    refs = [tokenizer.decode(r, skip_special_tokens=True) for r in hf_greedy(tiny_model_dir, ids, 6)]
    for prompt, expected in ((PROMPTS, refs), (ids, refs), (PROMPTS[0], refs[:1]), (ids[1], refs[1:])):
        out = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=6, temperature=0)
        assert [c.text for c in sorted(out.choices, key=lambda c: c.index)] == expected
        assert out.object == "text_completion" and out.usage.completion_tokens == 6 * len(expected)


def test_echo_with_logprobs_scores_the_prompt(client, tokenizer, tiny_model_dir):
    ids = tokenizer(PROMPTS[1])["input_ids"]
    reference = _hf_prompt_logprobs(tiny_model_dir, ids)
    next_token = hf_greedy(tiny_model_dir, [ids], 1)[0][0]
    for max_tokens in (0, 1):
        out = client.completions.create(model=MODEL_NAME, prompt=[ids], max_tokens=max_tokens, temperature=0,
                                        logprobs=1, echo=True, seed=1234)
        lp = out.choices[0].logprobs
        assert len(lp.tokens) == len(ids) + max_tokens
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        for got, want in zip(lp.token_logprobs[1:len(ids)], reference, strict=True):
            assert abs(got - want) <= 1e-4
        for tok, top in zip(lp.token_logprobs[1:], lp.top_logprobs[1:], strict=True):
            assert tok in top.values() and 1 <= len(top) <= 2
        assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
        text = tokenizer.decode(ids)
        if max_tokens == 0:
            assert out.choices[0].text == text and out.usage.completion_tokens == 0
        else:
            assert out.choices[0].text == text + tokenizer.decode([next_token])


def test_chat_completion_matches_hf_greedy(client, tokenizer, tiny_model_dir):
    messages = [{"role": "user", "content": "Say something about the sea."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    ref = tokenizer.decode(hf_greedy(tiny_model_dir, [ids], 5)[0], skip_special_tokens=True)
    out = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=5, temperature=0,
                                         logprobs=True, top_logprobs=2)
    assert out.choices[0].message.content == ref
    assert len(out.choices[0].logprobs.content) == 5
    assert out.usage.prompt_tokens == len(ids)


def test_concurrent_requests_get_what_they_get_alone(client):
    def ask(i: int) -> list[str]:
        out = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[i % 2], max_tokens=8, temperature=0.8,
                                        seed=i, n=2)
        return [c.text for c in out.choices]

    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(ask, range(6)))
    assert together == [ask(i) for i in range(6)]  # seeded samples do not depend on who else was running


def test_keys_and_limits(server, client):
    url = f"{server}/v1/completions"
    body = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2}
    assert httpx.post(url, json=body, timeout=30).status_code == 401
    wrong = httpx.post(url, json=body, headers={"Authorization": "Bearer nope"}, timeout=30)
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    big = httpx.post(url, json={**body, "prompt": "x" * (2 << 20)}, headers={"Authorization": f"Bearer {KEY}"},
                     timeout=30)
    assert big.status_code == 413
    for extra, param in (({"n": 129}, "n"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
                         ({"logprobs": 21}, "logprobs"), ({"stream_options": {"include_usage": True}}, "stream_options"),
                         ({"best_of": 3}, "best_of"),
                         ({"prompt": []}, "prompt"), ({"prompt": [49152]}, "prompt")):
        with pytest.raises(openai.BadRequestError) as exc:
            client.completions.create(**{**body, **extra})
        assert exc.value.body["param"] == param, (extra, exc.value.body)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(**{**body, "model": "other"})


def test_local_completions_reports_what_the_tokenmill_model_reports(server, tiny_model_dir, tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    from harness.model import TokenmillLM

    include_path = write_tasks(tmp_path / "tasks")
    embedded = evaluate(TokenmillLM(model=str(tiny_model_dir), max_num_seqs=8, num_kv_blocks=512, num_threads=1,
                                    progress=False), include_path)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    remote = evaluate("local-completions", include_path, {
        "base_url": f"{server}/v1/completions", "model": MODEL_NAME, "tokenizer": str(tiny_model_dir),
        "tokenizer_backend": "huggingface", "max_length": 1024, "num_concurrent": 3, "max_retries": 1},
        batch_size=4)
    for task in TASKS:
        ours, theirs = responses(embedded, task), responses(remote, task)
        if task == "tm_gen":
            assert ours == theirs
            continue
        flat = [x for doc in ours for x in doc]
        other = [x for doc in theirs for x in doc]
        for a, b in zip(flat, other, strict=True):
            if isinstance(a, tuple | list):
                assert abs(a[0] - b[0]) <= 1e-4 and bool(a[1]) == bool(b[1])
            else:
                assert abs(a - b) <= 1e-4 + 1e-6 * abs(b)
        for key, value in metrics(embedded, task).items():
            other_value = metrics(remote, task)[key]
            if isinstance(value, float) and ("perplexity" in key or "bits_per_byte" in key):
                assert abs(value - other_value) <= 1e-6 * abs(value)
            else:
                assert value == other_value, (task, key)
