"""Structured output through xgrammar: JSON schema, regex, choice and EBNF constraints."""

from __future__ import annotations

import json
import math
import re

import jsonschema
import pytest

from engine import LLM, RequestError, SamplingParams, StructuredOutput

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
     "required": ["answer", "sure"], "additionalProperties": False},
    {"type": "object", "properties": {"colours": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                                                  "minItems": 1, "maxItems": 3}},
     "required": ["colours"], "additionalProperties": False},
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                      "rank": {"type": "integer", "minimum": 1, "maximum": 9}},
     "required": ["city", "rank"], "additionalProperties": False},
]
QUESTIONS = ["Describe a person.", "Is the sky blue?", "Name some colours.", "Name a city you like.", "Answer in JSON."]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("smollm2-135m-instruct", num_kv_blocks=512, max_num_seqs=128)


def chat(llm: LLM, text: str) -> list[int]:
    return llm.engine.apply_chat_template([{"role": "user", "content": text}])


def test_100_json_outputs_validate(llm):
    """25 prompts x n=4 samples: each prompt is computed once and its blocks shared by its samples."""
    prompts, params = [], []
    for i in range(25):
        schema = SCHEMAS[i % len(SCHEMAS)]
        prompts.append(chat(llm, f"{QUESTIONS[i % len(QUESTIONS)]} Reply with JSON only."))
        # json given as a dict for some requests and as a JSON string for others: one grammar each.
        spec = schema if i % 2 else json.dumps(schema)
        params.append(SamplingParams(n=4, max_tokens=40, temperature=0.8, seed=i, structured_output=StructuredOutput(json=spec)))
    before = llm.stats()
    outs = llm.generate(prompts, params)
    texts = []
    for i, out in enumerate(outs):
        assert out.error is None and len(out.outputs) == 4
        for sample in out.outputs:
            assert sample.finish_reason == "stop", (i, sample.text)
            jsonschema.validate(json.loads(sample.text), SCHEMAS[i % len(SCHEMAS)])
            texts.append(sample.text)
    assert len(texts) == 100 and len(set(texts)) > 10  # sampled, not one answer repeated
    after = llm.stats()
    assert after["structured_output_grammars_compiled"] - before["structured_output_grammars_compiled"] == len(SCHEMAS)
    assert after["forked_samples"] - before["forked_samples"] == 75
    assert after["fork_shared_blocks"] - before["fork_shared_blocks"] >= 75  # every prompt has a full block
    assert after["prompt_tokens_computed"] - before["prompt_tokens_computed"] <= sum(len(p) for p in prompts)


def test_regex_choice_and_grammar(llm):
    p = chat(llm, "Give me a phone number and a colour.")
    outs = llm.generate(
        [p] * 4,
        [
            SamplingParams(max_tokens=12, temperature=0, structured_output=StructuredOutput(regex=r"\d{3}-\d{4}")),
            SamplingParams(max_tokens=16, temperature=0, structured_output=StructuredOutput(choice=["red", "green", 'a "quoted" one'])),
            SamplingParams(max_tokens=8, temperature=0, structured_output={"grammar": 'root ::= ("yes" | "no") "!"'}),
            SamplingParams(n=3, max_tokens=8, temperature=1.0, seed=4,
                           structured_output=StructuredOutput(choice=["alpha", "beta", "gamma"])),
        ],
    )
    assert re.fullmatch(r"\d{3}-\d{4}", outs[0].text), outs[0].text
    assert outs[1].text in ("red", "green", 'a "quoted" one')
    assert outs[2].text in ("yes!", "no!")
    assert [c.text in ("alpha", "beta", "gamma") for c in outs[3].outputs] == [True] * 3
    assert all(o.finish_reason == "stop" for o in outs[:3])


def test_unconstrained_rows_are_not_affected(llm):
    prompts = [chat(llm, q) for q in QUESTIONS[:3]]
    plain = SamplingParams(max_tokens=12, temperature=0)
    alone = llm.generate(prompts, plain)
    constrained = SamplingParams(max_tokens=12, temperature=0, structured_output=StructuredOutput(regex="[a-z ]{40}"))
    mixed = llm.generate(prompts + prompts[:2], [plain] * len(prompts) + [constrained] * 2)
    assert [o.token_ids for o in mixed[: len(prompts)]] == [o.token_ids for o in alone]
    assert all(re.fullmatch("[a-z ]+", o.text) for o in mixed[-2:])  # the constrained mates were masked


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"regex": "ab(c"}, "structured_output.regex cannot be compiled: Regex parsing error at position 5: The parenthesis is not closed."),
        ({"grammar": "root ::= item"}, 'structured_output.grammar cannot be compiled: EBNF parser error at line 1, column 10: Rule "item" is not defined'),
        ({"json": {"type": "nonsense"}}, 'structured_output.json cannot be compiled: Unsupported type "nonsense"'),
    ],
)
def test_uncompilable_constraint_is_an_error_output(llm, spec, message):
    with pytest.raises(RequestError) as err:
        llm.engine.add_request("bad-1", [1, 2, 3], SamplingParams(structured_output=spec))
    assert str(err.value) == f"request bad-1: {message}"
    good, bad = llm.generate(["Hello", "Hello"], [SamplingParams(max_tokens=2, temperature=0), {"structured_output": spec}])
    assert good.error is None and len(good.token_ids) == 2
    assert bad.finish_reason == "error" and bad.error.endswith(message) and bad.outputs[0].finish_reason == "error"


def test_invalid_structured_output_params():
    with pytest.raises(ValueError, match="exactly one of json, regex, choice, grammar, json_object; got json, regex"):
        StructuredOutput(json={}, regex="a")
    with pytest.raises(ValueError, match="exactly one of json, regex, choice, grammar, json_object; got none"):
        SamplingParams.from_dict({"structured_output": {}})
    with pytest.raises(ValueError, match="choice must be a non-empty list of non-empty strings"):
        StructuredOutput(choice=[])
    with pytest.raises(ValueError, match="unknown structured_output field"):
        SamplingParams.from_dict({"structured_output": {"schema": {}}})
    params = SamplingParams.from_dict({"n": 2, "structured_output": {"regex": "a+"}})
    assert SamplingParams.from_dict(params.to_dict()) == params


def test_logprobs_of_constrained_rows_are_masked(llm):
    """As in vLLM, a constrained sample's logprobs are over the tokens its grammar allows."""
    out = llm.generate(
        [chat(llm, "Pick one.")],
        SamplingParams(max_tokens=8, temperature=0, logprobs=5, structured_output=StructuredOutput(choice=["yes", "no"])),
    )[0]
    assert out.text in ("yes", "no")
    first = out.logprobs[0]
    assert all(lp.logprob > float("-inf") for lp in first.values())
    assert {llm.tokenizer.decode([t]) for t in first} <= {"yes", "no", "y", "n", "ye"}
    assert sum(math.exp(lp.logprob) for lp in first.values()) <= 1 + 1e-4


def test_the_reused_bitmask_gives_the_masks_of_a_fresh_one(llm):
    """apply_masks keeps one bitmask across steps: a row filled in an earlier step, or left
    unfilled for an unconstrained row, must never leak into a later step's masks."""
    import torch
    import xgrammar as xgr

    backend = llm.engine.structured
    text = '{"name": "Ann", "age": 30}'
    ids = llm.tokenizer.encode(text, add_special_tokens=False)
    matchers = [backend.matcher(StructuredOutput(json=SCHEMAS[0])), backend.matcher(StructuredOutput(regex="[0-9]+"))]
    vocab = backend.vocab_size
    digit = llm.tokenizer.convert_tokens_to_ids("3")
    steps = 0
    for token in ids:
        for i, matcher in enumerate(matchers):
            fresh = xgr.allocate_token_bitmask(1, vocab)
            matcher.fill_next_token_bitmask(fresh, 0)
            dirty = torch.randint(-(2**31), 2**31 - 1, fresh.shape, dtype=torch.int32)
            matcher.fill_next_token_bitmask(dirty, 0)
            assert torch.equal(dirty, fresh), (steps, i)
        logits = torch.randn(3, vocab)
        rows = [matchers[0], None, matchers[1]]
        want = logits.clone()
        fresh = xgr.allocate_token_bitmask(3, vocab)
        for i in (0, 2):
            rows[i].fill_next_token_bitmask(fresh, i)
        xgr.apply_token_bitmask_inplace(want, fresh, vocab_size=vocab, indices=[0, 2])
        assert torch.equal(backend.apply_masks(logits.clone(), rows), want)
        if not matchers[0].accept_token(token):
            break
        assert matchers[1].accept_token(digit)
        steps += 1
    assert steps > 3
