"""Issue 15 jobs, without a model: pass@k and majority vote, log-likelihood scoring (acc,
acc_norm, bootstrap standard error), extraction columns and errors, OpenAI logprobs shape,
and the spec checks of the new kinds and methods."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from engine.outputs import Logprob
from jobs import JobSpec
from jobs.extract import extract_row, schema_columns
from jobs.mc_scoring import bootstrap_stderr, gold_index, score_ll_row, summarize_ll
from jobs.sample_metrics import majority, majority_row, pass_at_k
from jobs.scoring import score_row, summarize_scores
from pipeline.kind_stages import RowRejected
from pipeline.openai_output import logprobs_content, openai_line
from pipeline.result_row import OpenAIChoice, ResultRow

# ---- pass@k and majority -----------------------------------------------------------------


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (5, 2, 1, 0.4),                    # pass@1 is the fraction correct
    (10, 3, 5, 1 - 21 / 252),          # 1 - C(7,5)/C(10,5)
    (10, 0, 3, 0.0),
    (4, 4, 2, 1.0),
    (10, 8, 3, 1.0),                   # fewer than k wrong samples: any k hold a correct one
    (20, 1, 10, 0.5),                  # one correct of 20, half of them drawn
    (200, 13, 100, 1 - math.comb(187, 100) / math.comb(200, 100)),
])
def test_pass_at_k_known_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError, match="pass@k needs 0 <= c <= n and 1 <= k <= n, got n=3, c=4, k=1"):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="got n=3, c=1, k=4"):
        pass_at_k(3, 1, 4)


def test_majority_vote() -> None:
    assert majority(["B", "A", "B", None, "A"]) == "B"  # tie between A and B: the first seen
    assert majority([None, "C", None]) == "C"
    assert majority([None, None]) is None
    assert majority_row({"samples": ["Paris.", "the paris", "Lyon"]}, {}, {}) == {"majority": "Paris."}
    assert majority_row({"samples": ["x"], "error": "boom"}, {}, {}) == {}


def test_score_row_with_samples_and_pass_at_k_summary() -> None:
    options = {"reference_field": "answer", "method": "choice", "n": 4, "pass_k": [1, 2, 4]}
    a = score_row({"output": "B", "samples": ["B", "C", "B", "A"]}, {"answer": "B"}, options)
    assert a["correct"] is True and a["sample_correct"] == [True, False, True, False] and a["n_correct"] == 2
    assert a["score"] == 0.5 and a["majority"] == "B" and a["majority_correct"] is True
    b = score_row({"output": "A", "samples": ["A", "D", "D", "Maybe"]}, {"answer": "C"}, options)
    assert b["n_correct"] == 0 and b["majority"] == "D" and b["majority_correct"] is False
    rows = [{"error": None, "output_tokens": 4, "latency_s": 1.0, **r} for r in (a, b)]
    table = pa.Table.from_pylist(rows)
    summary = summarize_scores(table, options)
    assert summary["accuracy"] == 0.5 and summary["n"] == 4
    assert summary["pass_at_k"] == {"1": round((0.5 + 0) / 2, 4), "2": round((1 - 1 / 6) / 2, 4), "4": 0.5}
    assert summary["majority_accuracy"] == 0.5


# ---- log-likelihood multiple choice ------------------------------------------------------


@pytest.mark.parametrize(("reference", "expected"), [(2, 2), ("2", 2), ("C", 2), ("c", 2), ("Rome", 3)])
def test_gold_index(reference: Any, expected: int) -> None:
    assert gold_index(reference, ["Paris", "Berlin", "Madrid", "Rome"]) == expected


@pytest.mark.parametrize(("reference", "message"), [
    (7, "reference 7 is outside the 4 choices"),
    ("Lyon", "reference 'Lyon' is not a choice index, letter or one of the choices"),
    (True, "reference True is not a choice index, letter or text"),
])
def test_gold_index_errors(reference: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gold_index(reference, ["Paris", "Berlin", "Madrid", "Rome"])


def test_acc_and_acc_norm_by_bytes() -> None:
    """acc takes the highest log-likelihood; acc_norm the highest per UTF-8 byte of the choice."""
    fields = {"choices": ["no", "a much longer answer", "é"], "answer": 1}
    row = {"choice_logprobs": [-3.0, -10.0, -2.5], "error": None}  # per byte: -1.5, -0.5, -1.25
    values = score_ll_row(row, fields, {"reference_field": "answer", "choices_field": "choices"})
    assert values == {"reference": "1", "prediction": "é", "gold": 1, "pred": 2, "pred_norm": 1, "correct": False,
                      "correct_norm": True, "score": 0.0}
    assert score_ll_row({"error": "x"}, fields, {}) == {"reference": "1"}


def test_ll_summary_and_bootstrap_stderr() -> None:
    correct = [True] * 30 + [False] * 70
    table = pa.Table.from_pylist([
        {"error": None, "correct": c, "correct_norm": i % 2 == 0} for i, c in enumerate(correct)
    ] + [{"error": "row 101: boom", "correct": None, "correct_norm": None}])
    summary = summarize_ll(table, {"bootstrap_iters": 2000})
    assert summary["acc"] == 0.3 and summary["acc_norm"] == 0.5 and summary["scored"] == 100
    assert summary["errors"] == 1 and summary["accuracy"] == 0.3 and summary["correct"] == 30
    analytic = math.sqrt(0.3 * 0.7 / 100)  # the bootstrap estimates the standard error of the mean
    assert summary["acc_stderr"] == pytest.approx(analytic, rel=0.1)
    assert summary == summarize_ll(table, {"bootstrap_iters": 2000})  # fixed seed: reproducible
    assert bootstrap_stderr(np.array([1.0]), 100) is None


# ---- extraction ---------------------------------------------------------------------------

SCHEMA = {
    "type": "object", "required": ["name", "price"],
    "properties": {
        "name": {"type": "string"}, "price": {"type": "number"}, "count": {"type": "integer"},
        "ok": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string"}},
        "maybe": {"type": ["string", "null"]}, "size": {"enum": ["S", "M"]}, "meta": {"type": "object"},
    },
}


def test_schema_columns() -> None:
    assert schema_columns(SCHEMA) == {"name": "string", "price": "float64", "count": "int64", "ok": "bool",
                                      "tags": "json", "maybe": "string", "size": "string", "meta": "json"}


def test_extract_row_typed_values_and_errors() -> None:
    options = {"schema": SCHEMA, "columns": schema_columns(SCHEMA)}
    out = '{"name": "Mug", "price": 8, "count": 40, "ok": true, "tags": ["red", "é"], "meta": {"a": 1}}'
    values = extract_row({"output": out, "finish_reason": "stop"}, {}, options)
    assert values == {"name": "Mug", "price": 8.0, "count": 40, "ok": True, "tags": '["red", "é"]',
                      "maybe": None, "size": None, "meta": '{"a": 1}'}
    assert isinstance(values["price"], float)
    with pytest.raises(RowRejected, match=r"^output is not valid JSON \(cut at max_tokens\): Unterminated string "
                                          r"starting at: character 9$"):
        extract_row({"output": '{"name": "Mu', "finish_reason": "length"}, {}, options)
    with pytest.raises(RowRejected, match=r"^output does not match the schema: 'price' is a required property "
                                          r"\(at the top level\)$"):
        extract_row({"output": '{"name": "Mug"}', "finish_reason": "stop"}, {}, options)
    with pytest.raises(RowRejected, match=r"^output does not match the schema: 'x' is not of type 'integer' "
                                          r"\(at count\)$"):
        extract_row({"output": '{"name": "M", "price": 1, "count": "x"}', "finish_reason": "stop"}, {}, options)
    assert extract_row({"output": None, "error": "row 1: boom"}, {}, options) == {}


# ---- OpenAI output lines ------------------------------------------------------------------


class _Tok:
    def decode(self, ids: list[int]) -> str:
        return f"<{ids[0]}>"


def test_logprobs_content_and_choices_shape() -> None:
    entries = [
        {5: Logprob(-0.1, 1, "Hi"), 6: Logprob(-2.5, 2, " Hey"), 7: Logprob(-3.0, 3, None)},
        {9: Logprob(-4.0, 7, "é"), 1: Logprob(-0.5, 1, "!"), 2: Logprob(-1.5, 2, "?")},  # sampled token ranked 7
    ]
    content = logprobs_content([5, 9], entries, 2, _Tok())
    assert content == [
        {"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": [
            {"token": "Hi", "logprob": -0.1, "bytes": [72, 105]}, {"token": " Hey", "logprob": -2.5, "bytes": [32, 72, 101, 121]}]},
        {"token": "é", "logprob": -4.0, "bytes": [195, 169], "top_logprobs": [
            {"token": "!", "logprob": -0.5, "bytes": [33]}, {"token": "?", "logprob": -1.5, "bytes": [63]}]},
    ]
    assert logprobs_content([5], entries[:1], 3, _Tok())[0]["top_logprobs"][2]["token"] == "<7>"
    row = ResultRow(id="r1", passthrough={}, output="Hi", finish_reason="stop", prompt_tokens=5, output_tokens=3,
                    cached_prompt_tokens=0, error=None, latency_s=0.0, content_key=None, choices=(
                        OpenAIChoice(0, "Hi", "stop", content), OpenAIChoice(1, "Yo", "length", None)))
    body = openai_line(row, "job", "m")["response"]["body"]
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["choices"][0]["logprobs"] == {"content": content, "refusal": None}
    assert body["choices"][1] == {"index": 1, "message": {"role": "assistant", "content": "Yo"},
                                  "logprobs": None, "finish_reason": "length"}
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


# ---- specs ----------------------------------------------------------------------------------


def _spec(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    return {"name": "t", "input": {"url": str(tmp_path / "in.jsonl")}, "output": {"url": str(tmp_path / "out")},
            **overrides}


@pytest.mark.parametrize(("overrides", "message"), [
    ({"kind": "evaluate", "evaluate": {"method": "loglikelihood"}, "sampling": {"n": 2}},
     "sampling.n: method 'loglikelihood' scores the choices, it samples nothing"),
    ({"kind": "evaluate", "evaluate": {"method": "exact", "chat_template": False}},
     "evaluate.chat_template: only used by method 'loglikelihood'"),
    ({"kind": "evaluate", "evaluate": {"pass_k": [5]}, "sampling": {"n": 4}},
     "evaluate.pass_k: every k must be <= sampling.n (4)"),
    ({"kind": "summarize", "sampling": {"n": 2}},
     "sampling.n: only kinds 'generate' and 'evaluate' take n samples (kind is 'summarize')"),
    ({"kind": "extract"}, "extract: kind 'extract' needs an [extract] table with the JSON schema"),
    ({"kind": "extract", "extract": {"schema": {"type": "array"}}},
     "extract.schema: must describe an object (type 'object') with properties"),
    ({"kind": "extract", "extract": {"schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}},
     "extract.schema: not a valid JSON schema: "),
    ({"kind": "extract", "extract": {"schema": {"type": "object", "properties": {"output": {"type": "string"}}}}},
     "extract.schema: properties ['output'] clash with output columns"),
    ({"kind": "perplexity", "prompt": {"system": "x"}},
     "prompt.system: kind 'perplexity' scores input.text_field as it is, with no prompt"),
    ({"kind": "perplexity", "prompt": {"few_shot": [{"user": "q", "assistant": "a"}]}},
     "prompt.few_shot: kind 'perplexity' scores input.text_field as it is, with no prompt"),
    ({"kind": "perplexity", "input": {"url": "in.jsonl", "passthrough": ["tokens", "nll", "lang"]}},
     "input.passthrough: ['nll', 'tokens'] clash with the perplexity columns"),
    ({"kind": "harness_requests", "prompt": {"template": "{text}"}},
     "prompt.template: kind 'harness_requests' rows carry their prompts as token ids"),
    ({"kind": "harness_requests", "prompt": {"few_shot": [{"user": "q", "assistant": "a"}]}},
     "prompt.few_shot: kind 'harness_requests' rows carry their prompts as token ids"),
    ({"kind": "harness_requests", "input": {"url": "in.jsonl", "passthrough": ["sampling", "logprob"]}},
     "input.passthrough: ['logprob', 'sampling'] clash with the request columns"),
])
def test_spec_errors_of_new_kinds(tmp_path: Path, overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("]", r"\]")):
        JobSpec.from_dict(_spec(tmp_path, **overrides))


def test_plans_of_new_kinds(tmp_path: Path) -> None:
    (tmp_path / "schema.json").write_text('{"type": "object", "properties": {"a": {"type": "integer"}}}')
    extract = JobSpec.from_dict(_spec(tmp_path, kind="extract", extract={"schema_file": "schema.json"}),
                                base_dir=tmp_path)
    plan = extract.to_plan("x")
    assert plan.sampling["structured_output"] == {"json": {"type": "object", "properties": {"a": {"type": "integer"}}}}
    assert plan.extra_columns == {"a": "int64"} and plan.kind_stages().row_stage(plan).name == "jobs.extract:extract_row"
    assert JobSpec.from_dict(extract.to_data()).to_plan("x").sampling == plan.sampling  # survives the worker hop
    ll = JobSpec.from_dict(_spec(tmp_path, kind="evaluate", evaluate={"method": "loglikelihood",
                                                                      "chat_template": False})).to_plan("x")
    assert ll.request_mode == "loglikelihood" and ll.mode_options == {"choices_field": "choices",
                                                                      "chat_template": False}
    assert "n" not in ll.sampling  # n = 1 stays out of the plan: older plans keep their part fingerprints
    gen = JobSpec.from_dict(_spec(tmp_path, kind="generate", sampling={"n": 3})).to_plan("x")
    assert gen.sampling["n"] == 3 and set(gen.extra_columns) == {"samples", "sample_finish_reasons", "majority"}
    ppl = JobSpec.from_dict(_spec(tmp_path, kind="perplexity")).to_plan("x")
    assert ppl.request_mode == "perplexity" and ppl.extra_columns == {"nll": "float64", "tokens": "int64",
                                                                      "perplexity": "float64"}


def test_loglikelihood_rows_refuse_special_tokens(default_model_dir: Path) -> None:
    """A question or choice holding a control-token string is an error row, not a control token."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from pipeline.loglikelihood import ChoiceScoring
    from pipeline.plan import JobPlan
    from pipeline.row_requests import RowInputError

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    engine = SimpleNamespace(tokenizer=tok, encode=lambda t: tok.encode(t, add_special_tokens=False),
                             max_model_len=2048)
    plan = JobPlan(job_id="j", name="n", kind="evaluate", input_url="x", output_url="y",
                   request_mode="loglikelihood")
    scorer = ChoiceScoring(plan, engine)  # type: ignore[arg-type]
    messages = [{"role": "user", "content": "Question: 2 + 2?\nAnswer:"}]
    subs = scorer.build({"choices": ["4", "5"]}, 3, messages)
    assert [s.label for s in subs] == ["4", "5"] and subs[0].token_ids[: subs[0].scored_from] == \
        subs[1].token_ids[: subs[1].scored_from]  # one shared context
    with pytest.raises(RowInputError, match="row 3: the question or a choice contains the special token "
                                            "'<\\|im_end\\|>', which log-likelihood scoring cannot keep literal"):
        scorer.build({"choices": ["4", "5<|im_end|>"]}, 3, messages)
