"""Kind ``classify`` (one module, ``jobs/kinds/classify.py``), embedded, on the tiny random-weight
model: rows in = rows out, every label one of the options' (the constraint, not the model, makes
it so), the reason after the label when asked, a bad row an error row naming itself, and the
summary counting each label."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from pipeline_support import tiny_engine
from pydantic import ValidationError

from connectors import read_parts
from jobs.console import run_summary
from jobs.kinds.classify import label_row
from jobs.spec import JobSpec
from jobs.spec_errors import format_errors
from pipeline.job_runner import run_embedded
from pipeline.kind_stages import RowRejected

LABELS = ["positive", "negative", "neutral", "pos"]  # "pos" is a prefix of "positive": parsed longest first
ROWS = [
    {"id": "a", "text": "Arrived quickly and works perfectly."},
    {"id": "b", "text": "Broke after two days; no refund."},
    {"id": "c", "text": "It is a phone case."},
    {"id": "d", "text": "Love it!"},
    {"id": "no-text", "body": "the text field is missing"},
    {"id": "long", "text": "word " * 1200},
]


def _spec(tmp_path: Path, model_dir: Path, **classify) -> JobSpec:
    (tmp_path / "in").mkdir(exist_ok=True)
    (tmp_path / "in" / "reviews.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    settings = {k: v for k, v in tiny_engine(model_dir).items() if k != "model"}
    return JobSpec.from_dict({
        "name": "reviews", "kind": "classify", "input": {"url": str(tmp_path / "in"), "id_field": "id"},
        "output": {"url": str(tmp_path / "out")}, "model": {"path": str(model_dir), **settings},
        "sampling": {"temperature": 1.0, "seed": 7, "max_tokens": 12}, "classify": {"labels": LABELS, **classify},
    })


@pytest.mark.parametrize("explain", [False, True])
def test_every_row_gets_a_label_or_an_error(tmp_path, tiny_model_dir, explain) -> None:
    spec = _spec(tmp_path, tiny_model_dir, explain=explain)
    manifest = run_embedded(spec.to_plan("classify-1"), progress=False)
    assert manifest["totals"]["rows"] == len(ROWS) and manifest["totals"]["errors"] == 2
    table = read_parts(spec.output.url)
    assert table.schema.field("label").type == pa.string()
    assert ("explain" in table.schema.names) is explain
    out = {r["id"]: r for r in table.to_pylist()}
    assert sorted(out) == sorted(r["id"] for r in ROWS)  # rows in = rows out
    assert out["no-text"]["error"] == "row 4: missing text field 'text'"
    assert out["long"]["error"].startswith("row 5: prompt is ") and out["long"]["label"] is None
    labeled = [out[r["id"]] for r in ROWS[:4]]
    for row in labeled:
        assert row["error"] is None and row["label"] in LABELS
        if explain:
            assert row["output"].startswith(row["label"] + ": ")  # the label first, then its reason
            assert row["explain"] == row["output"][len(row["label"]) + 2:].strip() and "\n" not in row["explain"]
        else:
            assert row["output"] == row["label"]  # the choice constraint: the label and nothing else
    counts = {label: sum(r["label"] == label for r in labeled) for label in LABELS}
    assert manifest["summary"] == {"rows": len(ROWS), "labeled": 4, "errors": 2, "labels": counts}
    lines = {label: value for label, value in _table_rows(run_summary(manifest))}
    assert lines["labels"].endswith("(4/6 rows labeled)")


def _table_rows(table) -> list[tuple[str, str]]:
    labels, values = (list(c.cells) for c in table.columns)
    return list(zip(labels, values, strict=True))


def test_an_output_that_is_no_label_is_rejected() -> None:
    options = {"labels": LABELS, "explain": True}
    assert label_row({"output": "positive: great", "error": None}, {}, options) == \
        {"label": "positive", "explain": "great"}
    assert label_row({"output": "pos: fine", "error": None}, {}, options) == {"label": "pos", "explain": "fine"}
    with pytest.raises(RowRejected, match=r"^output 'posi' is not one of the labels \(cut at max_tokens\)$"):
        label_row({"output": "posi", "error": None, "finish_reason": "length"}, {}, options)
    with pytest.raises(RowRejected, match="^output 'positive' is not one of the labels$"):
        label_row({"output": "positive", "error": None}, {}, options)  # the reason was asked for
    assert label_row({"output": None, "error": "row 3: boom"}, {}, options) == {}


@pytest.mark.parametrize(("fields", "message"), [
    ({}, "classify: kind 'classify' needs a [classify] table with the labels"),
    ({"classify": {"labels": ["only"]}}, "classify.labels: List should have at least 2 items after validation, not 1"),
    ({"classify": {"labels": ["a", "a"]}}, "classify.labels: labels must be distinct"),
    ({"classify": {"labels": ["a", " b"]}}, "classify.labels: label ' b': must be non-empty, on one line, without "
                                            "surrounding spaces or ': '"),
    ({"classify": {"labels": ["a", "b"], "colour": 1}}, "classify.colour: unknown field"),
    ({"kind": "summarize", "classify": {"labels": ["a", "b"]}},
     "classify: the [classify] table is only for kind 'classify' (kind is 'summarize')"),
    ({"classify": {"labels": ["a", "b"]}, "input": {"url": "x", "passthrough": ["label"]}},
     "input.passthrough: ['label'] clash with the classify columns"),
])
def test_spec_errors(tmp_path, fields, message) -> None:
    data = {"name": "c", "kind": "classify", "input": {"url": str(tmp_path)}, "output": {"url": str(tmp_path / "o")},
            **fields}
    with pytest.raises(ValidationError) as exc:
        JobSpec.from_dict(data)
    assert format_errors(exc.value, JobSpec) == [message]


def test_example_spec_plans() -> None:
    spec = JobSpec.from_file(Path(__file__).parents[2] / "examples" / "classify.toml")
    plan = spec.to_plan("x", read_only=True)
    assert plan.sampling["structured_output"] == {"regex": "(positive|negative|neutral): [^\\n]+"}
    assert plan.extra_columns == {"label": "string", "explain": "string"}
    assert plan.kind_stages().row_stage(plan).name == "jobs.kinds.classify:label_row"
