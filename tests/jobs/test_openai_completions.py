"""OpenAI batch files of /v1/completions requests: the prompt is the model's whole input (no chat
template), the answers match HF transformers' greedy tokens, and a file mixing endpoints is refused."""

from __future__ import annotations

import json

import pytest
from engine_cases import hf_greedy
from pipeline_support import tiny_engine
from transformers import AutoTokenizer

from jobs.openai_requests import OpenAIBatchError, convert_requests
from jobs.spec import JobSpec
from pipeline.job_runner import run_embedded


def _line(custom_id: str, url: str, **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": "m", **body}})


def test_completion_prompts_match_hf_greedy(tmp_path, tiny_model_dir):
    prompts = {"a": "The quick brown fox", "b": "Numbers: one, two, three,"}
    (tmp_path / "in.jsonl").write_text(
        "".join(_line(k, "/v1/completions", prompt=p, max_tokens=6, temperature=0) + "\n" for k, p in prompts.items()))
    engine = {k: v for k, v in tiny_engine(tiny_model_dir).items() if k != "model"}
    spec = JobSpec.from_dict({"name": "completions", "kind": "openai_batch",
                              "input": {"url": str(tmp_path / "in.jsonl")}, "output": {"url": str(tmp_path / "out")},
                              "model": {"path": str(tiny_model_dir), **engine}})
    manifest = run_embedded(spec.to_plan(), progress=False)
    assert manifest["status"] == "succeeded"
    lines = {x["custom_id"]: x for x in map(json.loads, (tmp_path / "out" / "output.jsonl").read_text().splitlines())}
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = {k: tokenizer.encode(p) for k, p in prompts.items()}
    refs = dict(zip(ids, hf_greedy(tiny_model_dir, list(ids.values()), 6), strict=True))
    for key, line in lines.items():
        body = line["response"]["body"]
        assert body["object"] == "text_completion"
        assert body["usage"]["prompt_tokens"] == len(ids[key])
        assert body["choices"][0]["text"] == tokenizer.decode(refs[key], skip_special_tokens=True)


def test_one_endpoint_per_request_file(tmp_path):
    (tmp_path / "mixed.jsonl").write_text(
        _line("a", "/v1/chat/completions", messages=[{"role": "user", "content": "hi"}]) + "\n"
        + _line("b", "/v1/completions", prompt="hi") + "\n" + _line("c", "/v1/completions", prompt=[]) + "\n")
    with pytest.raises(OpenAIBatchError) as exc:
        convert_requests(str(tmp_path / "mixed.jsonl"), str(tmp_path / "out"))
    message = str(exc.value)
    assert "mixed.jsonl line 2: url '/v1/completions': one endpoint per batch (mixed.jsonl line 1 uses another)" \
        in message
    assert "mixed.jsonl line 3: body.prompt must be a non-empty string (one prompt per request)" in message
