"""Structured replies on the live routes through the stock ``openai`` client: ``response_format``
(``json_schema``, ``json_object``) on chat and completions, forced tool calls (named and
``"required"``, plain, streamed and with ``n`` > 1), the engine's bounds on every constraint and
the field its errors name, and vLLM's ``extra_body`` extensions."""

from __future__ import annotations

import json
import re

import httpx2 as httpx
import jsonschema
import openai
import pytest
from live_server import live_server
from pipeline_support import wait_until
from service_stack import MODEL_NAME

KEY = "sk-structured-test"
PROMPTS = ["The quick brown fox", "Numbers: one, two, three,"]


@pytest.fixture(scope="module")
def client(tmp_path_factory, tiny_model_dir):
    with live_server(tmp_path_factory.mktemp("structured"), tiny_model_dir, KEY) as running:
        wait_until(lambda: httpx.get(f"{running.url}/readyz", timeout=5).status_code == 200, 120, "ready")
        yield openai.OpenAI(base_url=f"{running.url}/v1", api_key=KEY, max_retries=0, timeout=60)

ANSWER = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
          "required": ["answer", "sure"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
ASK = [{"role": "user", "content": "Is the sky blue? Answer in JSON."}]


def test_json_schema_and_json_object_replies(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
    for seed in range(3):
        out = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=40, temperature=1.0,
                                             seed=seed, response_format=fmt)
        assert out.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(out.choices[0].message.content), ANSWER)
    streamed = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=40, temperature=1.0, seed=0,
                                              response_format=fmt, stream=True)
    first = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=40, temperature=1.0, seed=0,
                                           response_format=fmt)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == first.choices[0].message.content
    obj = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=40, temperature=0,
                                         response_format={"type": "json_object"})
    assert obj.choices[0].finish_reason == "stop"  # greedy on the tiny model: "{}", well inside 40 tokens
    assert isinstance(json.loads(obj.choices[0].message.content), dict)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=4,
                                       response_format={"type": "json_schema", "json_schema": {"name": "x"}})
    assert exc.value.body == {"message": "Missing required parameter: 'response_format.json_schema.schema'.",
                              "type": "invalid_request_error", "param": "response_format.json_schema.schema",
                              "code": "missing_required_parameter"}


def test_forced_tool_calls(client):
    named = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=60, temperature=0, tools=TOOLS,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    message = named.choices[0].message
    assert message.content is None and len(message.tool_calls) == 1
    assert message.tool_calls[0].function.name == "get_weather" and message.tool_calls[0].id.startswith("call_")
    jsonschema.validate(json.loads(message.tool_calls[0].function.arguments), WEATHER)
    seen = set()
    for seed in range(4):
        required = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=60, temperature=1.0,
                                                  seed=seed, tools=TOOLS, tool_choice="required")
        assert required.choices[0].finish_reason == "tool_calls"
        (call,) = required.choices[0].message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), WEATHER if call.function.name == "get_weather"
                            else TIME)
        seen.add(call.function.name)
    assert seen <= {"get_weather", "get_time"} and seen
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=60, temperature=0,
                                                 tools=TOOLS, tool_choice="required", stream=True))
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    once = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=60, temperature=0, tools=TOOLS,
                                          tool_choice="required").choices[0]
    assert [(t.function.name, t.function.arguments) for t in calls] == [
        (t.function.name, t.function.arguments) for t in once.message.tool_calls]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    several = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=60, temperature=1.0, seed=3,
                                             n=3, tools=TOOLS, tool_choice="required")
    assert sorted(c.index for c in several.choices) == [0, 1, 2]
    ids = [c.message.tool_calls[0].id for c in several.choices]  # every choice is its own whole call
    assert len(set(ids)) == 3 and all(c.finish_reason == "tool_calls" for c in several.choices)
    streamed = [t for c in client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=60,
                                                          temperature=1.0, seed=3, n=3, tools=TOOLS,
                                                          tool_choice="required", stream=True)
                for choice in c.choices for t in [(choice.index, d.function.name, d.function.arguments)
                                                  for d in choice.delta.tool_calls or []]]
    assert sorted(streamed) == sorted((c.index, c.message.tool_calls[0].function.name,
                                       c.message.tool_calls[0].function.arguments) for c in several.choices)
    plain = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=4, tools=[])
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].message.content is not None
    for extra, param in (({"tools": TOOLS}, "tool_choice"), ({"tools": TOOLS, "tool_choice": "auto"}, "tool_choice"),
                         ({"tool_choice": "required"}, "tool_choice"),
                         ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                          "tool_choice"),
                         ({"tools": [{"type": "function"}]}, "tools[0].function"),
                         ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice")):
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=4, **extra)
        assert exc.value.body["param"] == param, (extra, exc.value.body)


def test_constraints_are_bounded_and_named_by_the_field_that_asked(client):
    """The engine's 100k-character bound holds for tools' schemas and response_format on both
    routes, and a constraint that is refused names the field that asked for it."""
    huge = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 90}
                                             for i in range(1200)}}
    broken = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}, "required": ["a"]}
    for schema, why in ((huge, "the limit is 100000"), (broken, "")):
        tools = [{"type": "function", "function": {"name": "big", "parameters": schema}}]
        fmt = {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}
        named = {"type": "function", "function": {"name": "big"}}
        for create, extra, param in (
                (client.chat.completions.create, {"messages": ASK, "tools": tools, "tool_choice": "required"}, "tools"),
                (client.chat.completions.create, {"messages": ASK, "tools": tools, "tool_choice": named,
                                                  "stream": True}, "tools"),
                (client.completions.create, {"prompt": "hi", "extra_body": {"response_format": fmt}},
                 "response_format")):
            with pytest.raises(openai.BadRequestError) as exc:
                create(model=MODEL_NAME, max_tokens=4, **extra)
            assert exc.value.body["param"] == param and exc.value.body["message"].startswith(f"{param}: ")
            assert why in exc.value.body["message"], exc.value.body
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    for seed in range(2):
        out = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=40, temperature=1.0,
                                        seed=seed, extra_body={"response_format": fmt})
        jsonschema.validate(json.loads(out.choices[0].text), ANSWER)


def test_vllm_extensions_through_extra_body(client):
    """``structured_outputs``, ``ignore_eos`` and ``stop_token_ids`` as ``vllm serve`` takes them."""
    for seed in range(3):
        out = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=8, temperature=1.0, seed=seed,
                                        extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
        assert out.choices[0].text in ("yes", "no")
    digits = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=8, temperature=0,
                                            extra_body={"structured_outputs": {"regex": "[0-9]{3}"}})
    assert re.fullmatch("[0-9]{3}", digits.choices[0].message.content)
    long = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True, "stop_token_ids": []})
    assert long.usage.completion_tokens == 12
    for extra, param in (({"structured_outputs": {"bogus": 1}}, "structured_outputs"),
                         ({"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}},
                          "structured_outputs")):
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=4, extra_body=extra)
        assert exc.value.body["param"] == param, exc.value.body


def test_beam_search_through_extra_body(client, tiny_model_dir):
    """vLLM's ``use_beam_search`` / ``best_of`` on the live route: the engine's beams, best first."""
    from engine import LLM, SamplingParams

    prompt = [[5, 6, 7, 8]]
    out = client.completions.create(model=MODEL_NAME, prompt=prompt, n=2, max_tokens=6, temperature=0,
                                    extra_body={"use_beam_search": True, "best_of": 3, "ignore_eos": True})
    llm = LLM(str(tiny_model_dir), num_threads=1)
    want = llm.generate(prompt, SamplingParams(beam_width=3, n=2, max_tokens=6, ignore_eos=True))[0].outputs
    assert [c.text for c in out.choices] == [o.text for o in want]
    for extra, message in (({"length_penalty": 0.5}, "length_penalty needs use_beam_search = true"),
                           ({"use_beam_search": True, "stream": True}, "not as a stream")):
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=4, extra_body=extra)
        assert message in info.value.body["message"]
