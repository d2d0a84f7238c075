"""Job kinds: the scorer on known cases, each kind end to end embedded (tiny model; one
summarize run on the default model), OpenAI batch round trip, the evaluation report."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pipeline_support import jsonl_bytes, tiny_engine

from connectors import read_manifest, read_parts
from jobs import JobSpec, run
from jobs.openai_requests import OpenAIBatchError, convert_requests
from jobs.report import write_report
from jobs.scoring import (
    extract_choice,
    normalize_answer,
    reference_choice,
    score_answer,
    score_row,
    summarize_scores,
)

# ---- the scorer ---------------------------------------------------------------------------


def test_normalize_answer() -> None:
    assert normalize_answer("  The Eiffel   Tower! ") == "eiffel tower"
    assert normalize_answer("An apple, a day.") == "apple day"
    assert normalize_answer("U.S.A.") == "usa"
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words


@pytest.mark.parametrize(
    ("output", "reference", "method", "pattern", "expected"),
    [
        ("Paris.", "paris", "exact", None, ("paris", True)),
        ("The Paris", "Paris!", "exact", None, ("paris", True)),
        ("Paris, France", "Paris", "exact", None, ("paris france", False)),
        ("It is Lyon", ["Paris", "lyon"], "exact", None, ("it is lyon", False)),
        ("lyon", ["Paris", "Lyon"], "exact", None, ("lyon", True)),
        ("B", "B", "choice", None, ("B", True)),
        ("(C) Paris", "C", "choice", None, ("C", True)),
        ("The answer is D.", "d", "choice", None, ("D", True)),
        ("Answer: A", "(A) Berlin", "choice", None, ("A", True)),
        ("a cat sat, so B", "B", "choice", None, ("B", True)),  # lowercase 'a' is not option A
        ("Both are wrong", "B", "choice", None, (None, False)),  # 'Both' holds no standalone letter
        ("E", 4, "choice", None, ("E", True)),  # 0-based index reference
        ("I think it is Paris, France.", "paris", "contains", None, ("i think it is paris france", True)),
        ("Parisian food", "Paris", "contains", None, ("parisian food", False)),  # whole words only
        ("answer is 42 apples", "42", "regex", r"answer is (\d+)", ("42", True)),
        ("answer is 41", "42", "regex", r"answer is (\d+)", ("41", False)),
        ("no number here", "42", "regex", r"answer is (\d+)", (None, False)),
        ("Result: YES", "yes", "regex", r"YES|NO", ("yes", True)),  # no group: the whole match
    ],
)
def test_score_answer(output, reference, method, pattern, expected) -> None:
    assert score_answer(output, reference, method, pattern) == expected


def test_choice_helpers_and_bad_reference() -> None:
    assert extract_choice("(B)") == "B" and extract_choice("ABC") is None and extract_choice("") is None
    assert reference_choice("c") == "C" and reference_choice(7) is None and reference_choice("xyz") is None
    with pytest.raises(ValueError, match="not a choice letter"):
        score_answer("A", "xyz", "choice")


def test_row_and_summary_hooks() -> None:
    options = {"reference_field": "gold", "method": "exact", "pattern": None}
    ok = score_row({"output": "Paris", "error": None}, {"gold": "paris"}, options)
    assert ok == {"reference": "paris", "prediction": "paris", "correct": True, "score": 1.0}
    failed = score_row({"output": None, "error": "row 3: boom"}, {"gold": "x"}, options)
    assert failed == {"reference": "x"}  # not scored
    with pytest.raises(ValueError, match="reference field 'gold' is missing"):
        score_row({"output": "x", "error": None}, {}, options)
    table = pa.table({
        "id": ["a", "b", "c", "d"], "error": [None, None, "boom", None], "finish_reason": ["stop"] * 4,
        "prompt_tokens": [5, 5, 0, 5], "output_tokens": [2, 3, 0, 1], "cached_prompt_tokens": [0, 4, 0, 4],
        "latency_s": [0.1, 0.2, 0.0, 0.3], "reference": ["A", "B", "B", "B"], "prediction": ["A", "C", None, "B"],
        "correct": [True, False, None, True], "score": [1.0, 0.0, None, 1.0],
    })
    summary = summarize_scores(table, {"method": "choice"})
    assert summary["rows"] == 4 and summary["scored"] == 3 and summary["correct"] == 2 and summary["errors"] == 1
    assert summary["accuracy"] == pytest.approx(2 / 3, abs=1e-4) and summary["output_tokens"] == 6
    assert summary["by_reference"] == {"A": {"scored": 1, "correct": 1, "accuracy": 1.0},
                                       "B": {"scored": 2, "correct": 1, "accuracy": 0.5}}
    json.dumps(summary)


# ---- embedded runs --------------------------------------------------------------------------


def write_jsonl(path: Path, rows: list[Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(jsonl_bytes(rows))


def tiny_spec(tmp_path: Path, model_dir: Path, **values: Any) -> JobSpec:
    data: dict[str, Any] = {
        "name": "tiny", "input": {"url": "in/"}, "output": {"url": "out/"},
        "model": {k if k != "model" else "path": v for k, v in tiny_engine(model_dir).items()},
        "sampling": {"max_tokens": 4, "ignore_eos": True},
    }
    for key, value in values.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) and key in data else value
    return JobSpec.from_dict(data, base_dir=tmp_path)


def test_summarize_embedded(tmp_path: Path, tiny_model_dir: Path) -> None:
    write_jsonl(tmp_path / "in/a.jsonl", [{"id": f"d{i}", "text": f"document {i} about things", "src": "x"}
                                          for i in range(4)])
    write_jsonl(tmp_path / "in/b.jsonl", [{"id": "e0", "text": "another document", "src": "y"},
                                          {"id": "e1", "text": ""}])
    spec = tiny_spec(tmp_path, tiny_model_dir, input={"id_field": "id", "passthrough": ["src"]},
                     prompt={"template": "Source {src}: {text}"})
    manifest = run(spec)
    assert manifest["status"] == "succeeded" and manifest["totals"]["rows"] == 6
    rows = {r["id"]: r for r in read_parts(str(tmp_path / "out")).to_pylist()}
    assert set(rows) == {"d0", "d1", "d2", "d3", "e0", "e1"}
    assert rows["d0"]["output_tokens"] == 4 and rows["d0"]["src"] == "x"
    assert "empty document" in rows["e1"]["error"]
    # the shared instruction is served from the prefix cache after the first row
    assert manifest["engine_stats"]["prefix_cache_hit_tokens"] > 0


def test_evaluate_embedded_with_report(tmp_path: Path, tiny_model_dir: Path) -> None:
    questions = [{"id": f"q{i}", "question": f"Question {i}? A) x B) y C) z", "answer": "ABC"[i % 3]}
                 for i in range(5)] + [{"id": "q-noref", "question": "No reference?"}]
    write_jsonl(tmp_path / "in/q.jsonl", questions)
    spec = tiny_spec(
        tmp_path, tiny_model_dir, kind="evaluate", input={"id_field": "id", "text_field": "question"},
        evaluate={"method": "choice"},
        prompt={"few_shot": [{"user": "Question? A) x B) y", "assistant": "B"}] * 3},
    )
    manifest = run(spec)
    table = read_parts(str(tmp_path / "out"))
    rows = {r["id"]: r for r in table.to_pylist()}
    assert "reference field 'answer' is missing" in rows["q-noref"]["error"]
    for q in questions[:5]:
        row = rows[q["id"]]
        assert row["reference"] == q["answer"] and row["error"] is None
        assert row["correct"] == (extract_choice(row["output"]) == q["answer"])  # scored on the worker
        assert row["score"] == float(row["correct"])
    summary = manifest["summary"]
    assert summary["rows"] == 6 and summary["scored"] == 5 and summary["errors"] == 1
    assert summary["correct"] == sum(rows[q["id"]]["correct"] for q in questions[:5])
    # few-shot turns are the shared prefix: every question after the first reuses them
    assert manifest["engine_stats"]["prefix_cache_hit_tokens"] >= 4 * 16
    # the run wrote the report itself (the kind's report hook: the same in fleet runs)
    assert manifest["report"] == {"chart": str(tmp_path / "out/report.png"), "markdown": str(tmp_path / "out/report.md")}
    assert read_manifest(str(tmp_path / "out"))["report"] == manifest["report"]
    assert (tmp_path / "out/report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (tmp_path / "out/report.md").read_text()
    assert "accuracy" in markdown and "![scores](report.png)" in markdown
    assert write_report(manifest)["markdown"] == manifest["report"]["markdown"]


def test_generate_embedded(tmp_path: Path, tiny_model_dir: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in/p.csv").write_text('id,prompt\np1,Write {braces} as-is\np2,"Say hi, politely"\np3,\n')
    spec = tiny_spec(tmp_path, tiny_model_dir, kind="generate", input={"id_field": "id"},
                     prompt={"prompt_field": "prompt"})
    run(spec)
    rows = {r["id"]: r for r in read_parts(str(tmp_path / "out")).to_pylist()}
    assert rows["p1"]["error"] is None and rows["p2"]["output_tokens"] == 4
    assert "empty document" in rows["p3"]["error"]


def batch_line(custom_id: str, content: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "gpt-x", "messages": [{"role": "user", "content": content}], **body}}


def test_openai_batch_round_trip(tmp_path: Path, tiny_model_dir: Path) -> None:
    lines = [batch_line(f"req-{i}", f"question {i}", max_tokens=3, temperature=0) for i in range(4)]
    lines[1]["body"]["messages"].insert(0, {"role": "system", "content": "Be brief."})
    lines[2]["body"]["messages"] = [{"role": "user", "content": [{"type": "text", "text": "parts"}]}]
    write_jsonl(tmp_path / "in/batch.jsonl", lines)
    spec = tiny_spec(tmp_path, tiny_model_dir, kind="openai_batch", sampling={"max_tokens": 50, "ignore_eos": True})
    plan = spec.to_plan("ob")
    assert plan.sampling["max_tokens"] == 50 and plan.sampling_field == "sampling" and plan.openai_output
    manifest = run(spec, job_id="ob")
    assert manifest["status"] == "succeeded"
    out = [json.loads(x) for x in (tmp_path / "out/output.jsonl").read_text().splitlines()]
    assert [x["custom_id"] for x in out] == [f"req-{i}" for i in range(4)]
    for x in out:
        assert x["error"] is None and x["response"]["status_code"] == 200 and x["id"].startswith("batch_req_")
        body = x["response"]["body"]  # each line's max_tokens (3) over the spec's 50
        assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 3
        assert body["choices"][0]["message"]["role"] == "assistant"
    table = read_parts(str(tmp_path / "out"))
    assert table.column("id").to_pylist() == [f"req-{i}" for i in range(4)]
    assert manifest["summary"]["openai_output"]["lines"] == 4
    # a re-run converts to the same rows: the part is current and skipped
    again = run(spec, job_id="ob2")
    assert again["totals"]["shards_skipped"] == 1 and read_manifest(str(tmp_path / "out"))["job_id"] == "ob2"


def test_openai_batch_input_validated_up_front(tmp_path: Path) -> None:
    bad = [
        batch_line("a", "fine"),
        batch_line("a", "duplicate id"),
        {**batch_line("c", "x"), "url": "/v1/moderations"},
        {**batch_line("d", "x"), "method": "GET"},
        {"custom_id": "e", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}},
        "{not json",
        batch_line("g", "x", n=0),
    ]
    write_jsonl(tmp_path / "in/batch.jsonl", bad)
    with pytest.raises(OpenAIBatchError) as info:
        convert_requests(str(tmp_path / "in"), str(tmp_path / "out"))
    message = str(info.value)
    assert "6 invalid request(s)" in message
    for expected in ("line 2: custom_id 'a' repeats batch.jsonl line 1", "line 3: url must be /v1/chat/completions",
                     "line 4: method must be POST", "line 5: body.messages: List should have at least 1 item",
                     "line 6: not JSON", "line 7: body: n must be an integer from 1 to 128, got 0"):
        assert expected in message
    assert not (tmp_path / "out").exists()  # nothing written


def test_openai_batch_per_line_sampling(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    write_jsonl(tmp_path / "in/b.jsonl", [
        batch_line("a", "x", max_tokens=5, temperature=0.2, tools=[]),
        batch_line("b", "y", max_completion_tokens=9, temperature=0.7, top_p=0.5, seed=3, stop="\n", n=2,
                   logprobs=True, top_logprobs=4, response_format={"type": "json_schema",
                                                                   "json_schema": {"name": "s", "schema": schema}}),
        batch_line("c", "z", logprobs=True, response_format={"type": "json_object"}),
        batch_line("d", "w", ignore_eos=True, structured_outputs={"choice": ["yes", "no"]}),
    ])
    converted = convert_requests(str(tmp_path / "in"), str(tmp_path / "out"))
    assert converted.requests == 4
    # no setting is shared by every request: the plan's sampling is the spec's alone
    spec = JobSpec.from_dict({"name": "b", "kind": "openai_batch", "input": {"url": "in/"}, "output": {"url": "out/"},
                              "sampling": {"max_tokens": 7}}, base_dir=tmp_path)
    assert spec.to_plan("b").sampling == spec.sampling.plan_values()
    assert any("ignored: tools" in w for w in converted.warnings)
    (converted_file,) = (tmp_path / "out/_requests").glob("requests-*.jsonl")
    rows = [json.loads(x) for x in converted_file.read_text().splitlines()]
    assert rows[0] == {"custom_id": "a", "text": "x", "messages": [{"role": "user", "content": "x"}],
                       "sampling": {"max_tokens": 5, "temperature": 0.2}}
    assert rows[1]["sampling"] == {"max_tokens": 9, "temperature": 0.7, "top_p": 0.5, "seed": 3, "stop": ["\n"],
                                   "n": 2, "logprobs": 4, "structured_output": {"json": schema}}
    assert rows[2]["sampling"] == {"logprobs": 0, "structured_output": {"json_object": True}}
    assert rows[3]["sampling"] == {"ignore_eos": True, "structured_output": {"choice": ["yes", "no"]}}


@pytest.mark.parametrize(("body", "message"), [
    ({"top_logprobs": 3}, "body.top_logprobs needs body.logprobs = true"),
    ({"logprobs": True, "top_logprobs": 21}, "body.top_logprobs: Input should be less than or equal to 20"),
    ({"response_format": {"type": "xml"}},
     "body.response_format.type: Input should be 'text', 'json_object' or 'json_schema'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "Missing required parameter: 'body.response_format.json_schema.schema'."),
    ({"response_format": {"type": "json_schema"}}, "body.response_format.json_schema.schema must be a JSON object"),
    ({"temperature": "0.5"}, "body.temperature: Input should be a valid number"),
    ({"stop": 3}, "body.stop must be a string or a list of strings"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "body.messages[0]: only text content parts are supported"),
    ({"temperature": -1}, "body: temperature must be a number >= 0, got -1"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"},
     "body.tool_choice: a forced tool call is answered on the live /v1/chat/completions route only"),
])
def test_openai_batch_bad_sampling_lines(tmp_path: Path, body: dict[str, Any], message: str) -> None:
    write_jsonl(tmp_path / "in/b.jsonl", [batch_line("a", "x", **body)])
    with pytest.raises(OpenAIBatchError, match=re.escape(f"b.jsonl line 1: {message}")):
        convert_requests(str(tmp_path / "in"), str(tmp_path / "out"))


@pytest.mark.slow
def test_summarize_default_model(tmp_path: Path, default_model_dir: Path) -> None:
    write_jsonl(tmp_path / "in/docs.jsonl", [
        {"id": "cats", "text": "Cats sleep for most of the day and are most active at dawn and dusk."},
        {"id": "rain", "text": "Heavy rain flooded the town's main road, so buses took a detour for two days."},
    ])
    spec = JobSpec.from_dict({
        "name": "default-model", "input": {"url": "in/", "id_field": "id"}, "output": {"url": "out/"},
        "model": {"name": "smollm2-135m-instruct", "num_kv_blocks": 256},
        "sampling": {"max_tokens": 24},
    }, base_dir=tmp_path)
    manifest = run(spec)
    assert manifest["status"] == "succeeded" and manifest["model"] == "smollm2-135m-instruct"
    rows = {r["id"]: r for r in read_parts(str(tmp_path / "out")).to_pylist()}
    assert rows["rain"]["error"] is None and rows["rain"]["output_tokens"] > 0
    # a real model writes real words about the document
    words = " ".join(r["output"].lower() for r in rows.values())
    assert any(w in words for w in ("rain", "flood", "road", "bus")) and any(w in words for w in ("cat", "sleep"))


@pytest.mark.slow
def test_evaluate_and_generate_default_model(tmp_path: Path, default_model_dir: Path) -> None:
    """The other kinds on the real default model: scored rows and free-form prompts."""
    questions = [
        {"id": "q1", "question": "What colour is the sky on a clear day?\nA) green B) blue C) red", "answer": "B"},
        {"id": "q2", "question": "How many legs does a cat have?\nA) four B) two C) six", "answer": "A"},
    ]
    write_jsonl(tmp_path / "eval/in/q.jsonl", questions)
    evaluate = run(JobSpec.from_dict({
        "name": "eval-default", "kind": "evaluate",
        "input": {"url": "in/", "id_field": "id", "text_field": "question"}, "output": {"url": "out/"},
        "model": {"name": "smollm2-135m-instruct", "num_kv_blocks": 256},
        "evaluate": {"method": "choice"}, "sampling": {"max_tokens": 8},
    }, base_dir=tmp_path / "eval"))
    assert evaluate["status"] == "succeeded" and evaluate["summary"]["scored"] == 2
    for row in read_parts(str(tmp_path / "eval/out")).to_pylist():
        assert row["error"] is None and row["output_tokens"] > 0
        assert row["correct"] == (extract_choice(row["output"]) == row["reference"])
    assert (tmp_path / "eval/out/report.md").is_file()

    write_jsonl(tmp_path / "gen/in/p.jsonl", [{"id": "p1", "prompt": "Name one fruit. Reply with one word."}])
    generate = run(JobSpec.from_dict({
        "name": "gen-default", "kind": "generate",
        "input": {"url": "in/", "id_field": "id"}, "output": {"url": "out/"},
        "prompt": {"prompt_field": "prompt"},
        "model": {"name": "smollm2-135m-instruct", "num_kv_blocks": 256}, "sampling": {"max_tokens": 8},
    }, base_dir=tmp_path / "gen"))
    assert generate["status"] == "succeeded"
    (row,) = read_parts(str(tmp_path / "gen/out")).to_pylist()
    assert row["id"] == "p1" and row["error"] is None and row["output"].strip()


def test_every_module_of_the_kinds_package_defines_its_kind() -> None:
    """The package's modules are the list of kinds: a helper module put there would become a
    kind the spec accepts and the worker cannot find."""
    from jobs.kinds import KIND_NAMES, job_kind

    assert KIND_NAMES[0] == "summarize"  # the default kind leads the spec's error
    for name in KIND_NAMES:
        assert job_kind(name).name == name
