"""One request cannot starve the others (issue 23, point 4): the same bounds wherever a request
enters (batch lines, specs, ``/v1/jobs``, the Python API, ``LLMEngine.add_request``), and a
constraint that compiles too slowly is its own row's error while the engine goes on."""

from __future__ import annotations

import json

import pytest
from pipeline_support import tiny_engine
from pydantic import ValidationError
from tenant_support import KEY_A, auth, client, settings_for, spec

from engine import LLM, RequestError, SamplingParams, StructuredOutput
from engine.structured_output import MAX_CONSTRAINT_CHARS, StructuredOutputBackend
from jobs.openai_requests import parse_request
from jobs.spec import JobSpec

TOO_MUCH = [
    ({"n": 129}, "n must be an integer from 1 to 128, got 129"),
    ({"n": 100_000}, "n must be an integer from 1 to 128, got 100000"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "at most 4 stop strings, got 5"),
    ({"stop": ["x" * 1025]}, "a stop string may be at most 1024 characters, got 1025"),
    ({"logprobs": 21}, "logprobs must be None or an integer from 0 to 20, got 21"),
    ({"prompt_logprobs": 21}, "prompt_logprobs must be None or an integer from 0 to 20, got 21"),
    ({"structured_output": {"regex": "a" * (MAX_CONSTRAINT_CHARS + 1)}},
     f"structured_output.regex is {MAX_CONSTRAINT_CHARS + 1} characters; the limit is {MAX_CONSTRAINT_CHARS}"),
]
SLOW = {"json": {"type": "string", "pattern": "^[a-z]{8000}$"}}  # about 2 s of xgrammar on this machine


@pytest.fixture(scope="module")
def llm(tiny_model_dir) -> LLM:
    settings = tiny_engine(tiny_model_dir)
    return LLM(settings.pop("model"), **settings)


@pytest.mark.parametrize(("values", "message"), TOO_MUCH)
def test_the_engine_refuses_a_request_over_the_limits(llm, values, message):
    with pytest.raises(ValueError, match="^" + message.replace("[", r"\[").replace("(", r"\(") + "$"):
        SamplingParams(**values)
    with pytest.raises(RequestError) as caught:
        llm.engine.add_request("greedy", [1, 2, 3], values)
    assert str(caught.value) == f"request greedy: invalid sampling parameters: {message}"
    SamplingParams(n=128, stop=["a", "b", "c", "d"], logprobs=20, prompt_logprobs=20)  # the limits themselves


def test_a_batch_line_and_a_spec_are_held_to_the_same_limits(tmp_path):
    line = {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "tiny-test", "messages": [{"role": "user", "content": "hi"}], "n": 100_000}}
    with pytest.raises(ValueError, match="^body: n must be an integer from 1 to 128, got 100000$"):
        parse_request(json.dumps(line))
    answer = client(settings_for(tmp_path)).post(
        "/v1/files", files={"file": ("in.jsonl", json.dumps(line).encode())}, data={"purpose": "batch"},
        headers=auth(KEY_A))
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == ("1 invalid line(s) in the batch input: line 1: body: n must be an "
                                                 "integer from 1 to 128, got 100000")
    for sampling, field in (({"stop": ["a", "b", "c", "d", "e"]}, "sampling.stop"), ({"n": 129}, "sampling.n")):
        with pytest.raises(ValidationError) as caught:
            JobSpec.from_dict(spec("s3://b/in/", "s3://b/out/", kind="generate", sampling=sampling))
        assert caught.value.errors()[0]["loc"] == tuple(field.split("."))
        answer = client(settings_for(tmp_path)).post(
            "/v1/jobs", json=spec("s3://b/in/", "s3://b/out/", kind="generate", sampling=sampling),
            headers=auth(KEY_A))
        assert answer.status_code == 400 and answer.json()["error"]["param"] == field


def test_a_constraint_that_compiles_too_slowly_is_its_rows_error(llm, monkeypatch):
    """The time bound behind the size bound (engine/constraint_size.py, lifted here to reach it)."""
    import engine.constraint_size

    monkeypatch.setattr(engine.constraint_size, "MAX_REPEAT", 10_000)
    backend = llm.engine.structured
    backend.compile_timeout_s = 0.2
    try:
        good, slow, again = llm.generate(["Hello", "Hello", "Hello"], [
            SamplingParams(max_tokens=3, temperature=0, ignore_eos=True),
            SamplingParams(max_tokens=3, structured_output=SLOW),
            SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, structured_output={"regex": "[a-z]+"}),
        ])
    finally:
        backend.compile_timeout_s = 5.0
    assert good.error is None and len(good.token_ids) == 3
    assert slow.finish_reason == "error"
    assert slow.error.endswith("structured_output.json took longer than 0.2 s to compile; simplify the constraint")
    assert again.error is None and len(again.token_ids) >= 1


def test_the_compiled_grammar_cache_is_bounded(llm):
    backend = StructuredOutputBackend(llm.tokenizer, llm.engine.structured.vocab_size,
                                      llm.engine.structured.stop_token_ids, max_cached=2)
    first, second, third = (StructuredOutput(regex=r) for r in ("[0-9]+", "[a-c]+", "x|y"))
    for so in (first, second, first, third):  # first was used last but one: second is dropped
        backend.compile(so)
    assert backend.num_compiled == 3 and len(backend._compiled) == 2
    backend.compile(first)
    assert backend.num_compiled == 3
    backend.compile(second)
    assert backend.num_compiled == 4 and len(backend._compiled) == 2
