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
