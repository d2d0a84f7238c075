"""Issue 15 jobs end to end on the real default model: log-likelihood multiple choice and
perplexity equal HF transformers' float32 log-softmax (within 1e-4), extraction gives typed
columns and an error row for a cut output, n samples give list columns and pass@k, and
OpenAI batch lines with n / logprobs / response_format come back in OpenAI's shape."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import jsonschema
import pyarrow as pa
import pytest
import torch

from connectors import read_parts
from jobs import JobSpec, run
from jobs.sample_metrics import pass_at_k

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
MODEL = {"name": "smollm2-135m-instruct", "num_kv_blocks": 512}  # one engine for the whole module


@pytest.fixture(scope="module")
def hf(default_model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(default_model_dir, torch_dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(default_model_dir)


def hf_logprobs(model: Any, ids: list[int]) -> list[float]:
    """log P(ids[p] | ids[:p]) for p = 1..len-1, from one HF forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return [logp[p - 1, ids[p]].item() for p in range(1, len(ids))]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def example_spec(name: str, tmp_path: Path, data: list[dict[str, Any]] | None = None, **changes: Any) -> JobSpec:
    """An examples/ spec, run on a copy of (a subset of) its data into tmp_path."""
    import tomllib

    values = tomllib.loads((REPO / "examples" / name).read_text())
    if data is not None:
        write_jsonl(tmp_path / "in" / "data.jsonl", data)
        values["input"]["url"] = "in/data.jsonl"
    values["output"]["url"] = "out/"
    values["model"] = MODEL
    for key, value in changes.items():
        values[key] = {**values.get(key, {}), **value} if isinstance(value, dict) else value
    return JobSpec.from_dict(values, base_dir=tmp_path)


def test_loglikelihood_matches_hf(tmp_path: Path, hf: tuple[Any, Any]) -> None:
    model, tok = hf
    rows = [json.loads(line) for line in (REPO / "examples/data/mmlu_style.jsonl").read_text().splitlines()][:3]
    manifest = run(example_spec("evaluate_loglikelihood.toml", tmp_path, rows), progress=False)
    assert manifest["status"] == "succeeded" and manifest["totals"]["errors"] == 0
    out = {r["id"]: r for r in read_parts(str(tmp_path / "out")).to_pylist()}
    assert list(out) == [r["id"] for r in rows]
    assert manifest["engine_stats"]["prefix_cache_hit_tokens"] > 0  # the choices share the context's blocks
    correct = []
    for row in rows:
        # lm-eval's recipe, written out with the HF tokenizer: context = the chat as text, its trailing
        # whitespace moved to the continuation; continuation tokens = suffix of encode(context + choice)
        messages = [{"role": "system", "content": "Answer the question."},
                    {"role": "user", "content": f"Question: {row['question']}\nAnswer:"}]
        context = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        stripped = context.rstrip()
        ctx_ids = tok.encode(stripped, add_special_tokens=False)
        expected = []
        for choice in row["choices"]:
            whole = tok.encode(stripped + context[len(stripped):] + choice, add_special_tokens=False)
            cont = whole[len(ctx_ids):]
            expected.append(sum(hf_logprobs(model, ctx_ids + cont)[len(ctx_ids) - 1:]))
        got = out[row["id"]]
        assert got["choice_logprobs"] == pytest.approx(expected, abs=1e-4)
        best = max(range(4), key=expected.__getitem__)
        assert got["pred"] == best and got["output"] == row["choices"][best] and got["gold"] == row["answer"]
        correct.append(best == row["answer"])
    assert manifest["summary"]["acc"] == round(sum(correct) / len(correct), 4)
    assert manifest["summary"]["acc_stderr"] is not None and manifest["summary"]["acc_norm"] is not None


def test_perplexity_matches_hf(tmp_path: Path, hf: tuple[Any, Any]) -> None:
    model, tok = hf
    docs = [json.loads(line) for line in (REPO / "examples/data/perplexity.jsonl").read_text().splitlines()][:3]
    manifest = run(example_spec("perplexity.toml", tmp_path, docs), progress=False)
    out = {r["id"]: r for r in read_parts(str(tmp_path / "out")).to_pylist()}
    prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    total_nll = total_tokens = 0
    for doc in docs:
        ids = tok.encode(doc["text"], add_special_tokens=False)
        nll = -sum(hf_logprobs(model, [prefix, *ids]))
        row = out[doc["id"]]
        assert row["error"] is None and row["tokens"] == len(ids)
        assert row["nll"] == pytest.approx(nll, abs=1e-4)
        assert row["perplexity"] == pytest.approx(math.exp(nll / len(ids)), rel=1e-5)
        total_nll, total_tokens = total_nll + nll, total_tokens + len(ids)
    summary = manifest["summary"]
    assert summary["tokens"] == total_tokens and summary["scored"] == 3
    assert summary["perplexity"] == pytest.approx(math.exp(total_nll / total_tokens), abs=1e-3)


def test_extract_typed_columns_and_cut_output(tmp_path: Path) -> None:
    schema = {"type": "object", "required": ["product", "price", "in_stock"], "properties": {
        "product": {"type": "string"}, "price": {"type": "number"}, "in_stock": {"type": "boolean"}}}
    rows = [{"id": "short", "text": "Mug, 8 dollars, in stock."},
            {"id": "long", "text": "The Extra Large Deluxe Waterproof Mountaineering Expedition Backpack With Twelve "
                                   "Zipped Pockets And A Rain Cover costs 120 dollars and is sold out."}]
    spec = example_spec("extract.toml", tmp_path, rows, sampling={"max_tokens": 30})
    spec.extract.json_schema = schema  # type: ignore[union-attr]
    manifest = run(spec, progress=False)
    table = read_parts(str(tmp_path / "out"))
    types = {f.name: f.type for f in table.schema}
    assert (types["product"], types["price"], types["in_stock"]) == (pa.string(), pa.float64(), pa.bool_())
    short, long = table.to_pylist()
    assert short["error"] is None and short["finish_reason"] == "stop"
    jsonschema.validate(json.loads(short["output"]), schema)
    assert short["product"] == json.loads(short["output"])["product"] and isinstance(short["price"], float)
    assert long["finish_reason"] == "length" and long["product"] is None
    assert long["error"].startswith("row 1: output is not valid JSON (cut at max_tokens): ")
    assert manifest["summary"] == {"rows": 2, "valid": 1, "errors": 1, "valid_fraction": 0.5}


def test_evaluate_with_n_samples(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in (REPO / "examples/data/mcq.jsonl").read_text().splitlines()][:2]
    spec = example_spec("evaluate_passk.toml", tmp_path, rows, sampling={"n": 4, "max_tokens": 2},
                        evaluate={"method": "choice", "pass_k": [1, 2, 4]})
    manifest = run(spec, progress=False)
    out = read_parts(str(tmp_path / "out")).to_pylist()
    assert [r["id"] for r in out] == [r["id"] for r in rows]  # one row per input row
    for r in out:
        assert len(r["samples"]) == 4 and len(r["sample_correct"]) == 4 and r["output"] == r["samples"][0]
        assert r["n_correct"] == sum(r["sample_correct"]) and r["correct"] == r["sample_correct"][0]
    expected = {str(k): round(sum(pass_at_k(4, r["n_correct"], k) for r in out) / 2, 4) for k in (1, 2, 4)}
    assert manifest["summary"]["pass_at_k"] == expected
    again = run(example_spec("evaluate_passk.toml", tmp_path / "again", rows, sampling={"n": 4, "max_tokens": 2},
                             evaluate={"method": "choice", "pass_k": [1, 2, 4]}), progress=False)
    assert again["status"] == "succeeded"  # same seed: the same samples
    assert [r["samples"] for r in read_parts(str(tmp_path / "again/out")).to_pylist()] == [r["samples"] for r in out]


def test_openai_batch_n_logprobs_response_format(tmp_path: Path) -> None:
    requests = [json.loads(line) for line in (REPO / "examples/data/batch_features.jsonl").read_text().splitlines()]
    requests[4]["body"]["max_tokens"] = 8  # json_object: only the shape is checked, keep it short
    write_jsonl(tmp_path / "batch.jsonl", requests)
    spec = example_spec("openai_batch_features.toml", tmp_path, input={"url": "batch.jsonl"})
    manifest = run(spec, progress=False)
    assert manifest["status"] == "succeeded"
    lines = {x["custom_id"]: x for x in map(json.loads, (tmp_path / "out/output.jsonl").read_text().splitlines())}
    bodies = {k: v["response"]["body"] for k, v in lines.items()}
    assert all(v["error"] is None for v in lines.values())
    assert [c["index"] for c in bodies["samples"]["choices"]] == [0, 1, 2]
    assert bodies["samples"]["usage"]["completion_tokens"] <= 3 * 8
    assert all(c["logprobs"] is None for c in bodies["plain"]["choices"] + bodies["samples"]["choices"])
    (choice,) = bodies["logprobs"]["choices"]
    content = choice["logprobs"]["content"]
    assert len(content) == bodies["logprobs"]["usage"]["completion_tokens"] and content
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"} and len(entry["top_logprobs"]) == 3
        assert entry["logprob"] <= 0 and entry["top_logprobs"][0]["logprob"] >= entry["logprob"]  # greedy: top 1
        assert entry["token"] == entry["top_logprobs"][0]["token"] and entry["bytes"] == list(entry["token"].encode())
    assert "".join(e["token"] for e in content).startswith(choice["message"]["content"])
    place = bodies["json-schema"]["choices"][0]
    assert place["finish_reason"] == "stop"
    schema = requests[3]["body"]["response_format"]["json_schema"]["schema"]
    jsonschema.validate(json.loads(place["message"]["content"]), schema)
    assert bodies["json-object"]["choices"][0]["message"]["content"].startswith("{")
