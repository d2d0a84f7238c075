"""Kind ``embed``, embedded, on the tiny model: rows in = rows out, each row's vector equal to
``LLM.embed`` of its text, typed ``fixed_size_list<float32>[dimensions]`` in the Parquet part,
and a row that cannot be embedded an error row naming itself."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pipeline_support import tiny_engine

from connectors import read_parts
from engine import LLM
from jobs.spec import JobSpec
from pipeline.job_runner import run_embedded


def _spec(tmp_path: Path, rows: list[dict], model_dir: Path, **fields) -> JobSpec:
    (tmp_path / "in").mkdir(exist_ok=True)
    (tmp_path / "in" / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings = {k: v for k, v in tiny_engine(model_dir).items() if k != "model"}
    return JobSpec.from_dict({
        "name": "vectors", "kind": "embed",
        "input": {"url": str(tmp_path / "in"), "id_field": "id", "passthrough": ["lang"]},
        "output": {"url": str(tmp_path / "out")}, "model": {"path": str(model_dir), **settings}, **fields,
    })


def test_rows_become_typed_vectors_and_bad_rows_error_rows(tmp_path, tiny_model_dir) -> None:
    texts = {"a": "The Moon orbits the Earth.", "b": "Plants make sugar from light.", "c": "The Moon orbits the Earth."}
    rows = [{"id": k, "text": v, "lang": "en"} for k, v in texts.items()]
    rows += [{"id": "empty", "text": ""}, {"id": "long", "text": "word " * 1200}]
    spec = _spec(tmp_path, rows, tiny_model_dir, embed={"pooling": "mean", "dimensions": 48})
    manifest = run_embedded(spec.to_plan("embed-1"), progress=False)
    assert manifest["status"] == "succeeded" and manifest["totals"]["rows"] == len(rows)
    table = read_parts(spec.output.url)
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 48)
    out = {r["id"]: r for r in table.to_pylist()}
    assert sorted(out) == sorted(r["id"] for r in rows)

    llm = LLM(str(tiny_model_dir), **{k: v for k, v in tiny_engine(tiny_model_dir).items() if k != "model"})
    ids = [llm.tokenizer(t, split_special_tokens=True)["input_ids"] for t in texts.values()]
    refs = llm.embed(ids, pooling="mean", dimensions=48)
    for key, ref in zip(texts, refs, strict=True):
        assert out[key]["error"] is None and out[key]["lang"] == "en"
        np.testing.assert_allclose(np.array(out[key]["embedding"], np.float32), ref.embedding, atol=1e-5)
    assert out["empty"]["embedding"] is None and out["empty"]["error"] == "row 3: empty document"
    assert out["long"]["error"] == ("row 4: text is 1201 tokens, over the 1023 that fit the context "
                                    "(set truncate_prompt = true to embed its beginning)")


@pytest.mark.parametrize(("fields", "message"), [
    ({"prompt": {"system": "be brief"}}, "prompt.system: kind 'embed' embeds the text (or prompt.template) as it is"),
    ({"embed": {"pooling": "max"}}, "embed.pooling"),
    ({"embed": {"dimensions": 65}}, "embed.dimensions: at most the model's hidden size 64, got 65"),
    ({"kind": "generate", "embed": {}}, "embed: the [embed] table is only for kind 'embed' (kind is 'generate')"),
])
def test_spec_errors(tmp_path, tiny_model_dir, fields, message) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("]", r"\]")):
        _spec(tmp_path, [{"id": "a", "text": "x"}], tiny_model_dir, **fields).to_plan("x")


def test_example_spec_plans(tmp_path) -> None:
    plan = JobSpec.from_file(Path(__file__).parents[2] / "examples" / "embed.toml").to_plan("x")
    assert plan.request_mode == "embed" and plan.extra_columns == {"embedding": "fixed_size_list<float32>[256]"}
    assert plan.mode_options == {"pooling": "mean", "normalize": True, "dimensions": 256}


def _line(custom_id: str, text, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
            "body": {"model": "text-embedding-3-small", "input": text, **body}}


def test_openai_batch_embedding_lines(tmp_path, tiny_model_dir) -> None:
    """``/v1/embeddings`` lines of a Batch API file: each line's answer is an embeddings list with
    the engine's vector (its own ``dimensions`` and ``encoding_format``); a bad line fails the
    file up front, naming it."""
    import base64

    from jobs import run
    from jobs.openai_requests import OpenAIBatchError, convert_requests

    texts = ["The Moon orbits the Earth.", "Plants make sugar from light."]
    lines = [_line("a", texts[0]), _line("b", [texts[1]], dimensions=16, encoding_format="base64")]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "batch.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    settings = {k: v for k, v in tiny_engine(tiny_model_dir).items() if k != "model"}
    spec = JobSpec.from_dict({"name": "eb", "kind": "openai_batch", "input": {"url": str(tmp_path / "in")},
                              "output": {"url": str(tmp_path / "out")},
                              "model": {"path": str(tiny_model_dir), **settings}})
    assert run(spec, job_id="eb")["status"] == "succeeded"
    out = {x["custom_id"]: x for x in map(json.loads, (tmp_path / "out/output.jsonl").read_text().splitlines())}
    llm = LLM(str(tiny_model_dir), **settings)
    ids = [llm.tokenizer(t, split_special_tokens=True)["input_ids"] for t in texts]
    full, short = llm.embed(ids[:1])[0].embedding, llm.embed(ids[1:], dimensions=16)[0].embedding
    body_a, body_b = out["a"]["response"]["body"], out["b"]["response"]["body"]
    assert out["a"]["error"] is None and body_a["object"] == "list" and body_a["usage"]["prompt_tokens"] == len(ids[0])
    np.testing.assert_allclose(np.array(body_a["data"][0]["embedding"], np.float32), full, atol=1e-5)
    got_b = np.frombuffer(base64.b64decode(body_b["data"][0]["embedding"]), "<f4")
    np.testing.assert_allclose(got_b, short, atol=1e-5)

    bad = [_line("c", ["one", "two"]), _line("d", "x", dimensions=0), _line("e", [1, 2, 3]),
           {**_line("f", "x"), "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "x"}]}}]
    (tmp_path / "in" / "batch.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [_line("ok", "x"), *bad]))
    with pytest.raises(OpenAIBatchError) as info:
        convert_requests(str(tmp_path / "in"), str(tmp_path / "out2"))
    message = str(info.value)
    for expected in ("line 2: body.input must be one text (one input per request line)",
                     "line 3: body.dimensions: Input should be greater than or equal to 1",
                     "line 4: body.input must be one text", "line 5: url '/v1/chat/completions': one endpoint per batch"):
        assert expected in message, message
