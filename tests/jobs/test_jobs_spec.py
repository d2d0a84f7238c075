"""Job specs: every bad field names itself, relative paths, secrets, schedules, the plan."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from jobs import JobSpec, SpecFileError
from jobs.kinds import KIND_NAMES
from jobs.schedule import parse_schedule
from jobs.spec_errors import format_errors
from pipeline.plan import JobPlan

REPO = Path(__file__).resolve().parents[2]


def spec_data(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"name": "t", "input": {"url": "/data/in/"}, "output": {"url": "/data/out/"}}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return data


def errors_of(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ValidationError) as info:
        JobSpec.from_dict(data)
    return format_errors(info.value, JobSpec)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"input": {"txt_field": "body"}}, "input.txt_field: unknown field; did you mean 'text_field'?"),
        ({"sampling": {"max_token": 5}}, "sampling.max_token: unknown field; did you mean 'max_tokens'?"),
        ({"nmae": "x"}, "nmae: unknown field; did you mean 'name'?"),
        ({"kind": "summarise"}, "kind: Input should be " + ", ".join(map(repr, KIND_NAMES[:-1])) + f" or {KIND_NAMES[-1]!r}"),
        ({"prompt": {"template": "{document.__class__}"}},
         "prompt.template: field '{document.__class__}' is not a plain field name"),
        ({"prompt": {"template": "{0.__init__}"}}, "prompt.template: field '{0.__init__}' is not a plain field name"),
        ({"prompt": {"template": "{text!r}"}}, "prompt.template: field '{text!r}' has a conversion or format spec"),
        ({"prompt": {"template": "{text"}}, "prompt.template: "),
        ({"schedule": "61 * * * *"}, "schedule: '61 * * * *' is not a schedule"),
        ({"schedule": "every day"}, "schedule: 'every day' is not a schedule"),
        ({"output": {"url": "out/../../etc"}}, "output.url: 'out/../../etc' contains a '..' segment"),
        ({"output": {"url": "s3://bucket/jobs/../other-team/"}}, "output.url: 's3://bucket/jobs/../other-team/'"),
        ({"output": {"url": "s3://bucket/a/%2E%2E/b"}}, "output.url: "),
        ({"sampling": {"max_tokens": -5}}, "sampling.max_tokens: Input should be greater than or equal to 1"),
        ({"sampling": {"temperature": -0.1}}, "sampling.temperature: Input should be greater than or equal to 0"),
        ({"sampling": {"top_p": 0}}, "sampling.top_p: Input should be greater than 0"),
        ({"model": {"block_size": 12}}, "model.block_size: must be a power of two, got 12"),
        ({"model": {"dtype": "int4"}}, "model.dtype: Input should be"),
        ({"model": {"name": "smollm2-135m-instruct", "path": "/m"}},
         "model.path: give model.name or model.path, not both"),
        ({"model": {"name": "smolm2"}},
         "model.name: unknown model 'smolm2'; packaged: gemma3-270m, smollm2-135m-instruct, or a Hub id 'org/name' (or give model.path)"),
        ({"name": "bad name!"}, "name: String should match pattern"),
        ({"evaluate": {"method": "exact"}}, "evaluate: the [evaluate] table is only for kind 'evaluate'"),
        ({"kind": "evaluate", "evaluate": {"method": "regex"}}, "evaluate.pattern: required when method = 'regex'"),
        ({"kind": "evaluate", "evaluate": {"method": "regex", "pattern": "(unclosed"}},
         "evaluate.pattern: not a valid regular expression"),
        ({"kind": "evaluate", "evaluate": {"method": "fuzzy"}}, "evaluate.method: Input should be"),
        ({"kind": "generate", "prompt": {"template": "{text}"}}, "prompt.template: kind 'generate' sends"),
        ({"prompt": {"prompt_field": "p"}}, "prompt.prompt_field: only used by kind 'generate'"),
        ({"input": {"format": "openai_batch"}}, "input.format: 'openai_batch' input needs kind = 'openai_batch'"),
        ({"kind": "openai_batch", "input": {"id_field": "id"}}, "input.id_field: not used by kind 'openai_batch'"),
        ({"input": {"passthrough": ["output"]}}, "input.passthrough: ['output'] clash with output columns"),
        ({"kind": "evaluate", "input": {"passthrough": ["score"]}}, "input.passthrough: ['score'] clash"),
        ({"prompt": {"few_shot": [{"user": "q"}]}}, "prompt.few_shot[0].assistant: required field missing"),
        ({"output": None}, "output: Input should be a valid dictionary"),
    ],
)
def test_bad_field_names_itself(overrides: dict[str, Any], expected: str) -> None:
    errors = errors_of(spec_data(**overrides))
    assert len(errors) == 1, errors
    assert errors[0].startswith(expected), errors


def test_missing_sections_and_several_errors_at_once() -> None:
    errors = errors_of({"name": "t", "kind": "nope", "sampling": {"max_tokens": 0}})
    assert "input: required field missing" in errors
    assert "output: required field missing" in errors
    assert any(e.startswith("kind: ") for e in errors)
    assert any(e.startswith("sampling.max_tokens: ") for e in errors)


def test_relative_paths_resolve_against_the_spec_folder(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "job.toml").write_text(
        'name = "rel"\n[input]\nurl = "../data/"\nglob = "*.jsonl"\n[output]\nurl = "out/"\n'
        '[model]\npath = "models/tiny"\n'
    )
    monkeypatch.chdir(REPO)  # not the spec's folder
    spec = JobSpec.from_toml(folder / "job.toml")
    assert spec.input.full_url == f"{tmp_path}/data/*.jsonl"
    assert spec.output.url == f"{folder}/out/"
    assert spec.model.engine_settings() == {"model": f"{folder}/models/tiny"}
    s3 = JobSpec.from_dict(spec_data(input={"url": "s3://b/in/"}, output={"url": "gs://b/out"}))
    assert (s3.input.url, s3.output.url) == ("s3://b/in/", "gs://b/out")


def test_yaml_spec_and_file_errors(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text("name: y\nkind: generate\ninput: {url: in.csv}\noutput: {url: out}\n")
    spec = JobSpec.from_file(tmp_path / "job.yaml")
    assert spec.kind == "generate" and spec.input.url == f"{tmp_path}/in.csv"
    (tmp_path / "bad.toml").write_text("name = \n")
    with pytest.raises(SpecFileError, match=r"bad\.toml: invalid TOML: .*line 1"):
        JobSpec.from_file(tmp_path / "bad.toml")
    with pytest.raises(SpecFileError, match=r"missing\.toml: cannot read"):
        JobSpec.from_file(tmp_path / "missing.toml")


def test_credentials_never_printed() -> None:
    options = {"key": "AKIAEXAMPLE", "secret": "hunter2-secret", "endpoint_url": "http://minio:9000",
               "client_kwargs": {"aws_session_token": "tok-123", "region_name": "eu-west-1"}}
    spec = JobSpec.from_dict(spec_data(input={"storage_options": options}))
    for shown in (repr(spec), str(spec), spec.model_dump_json(), str(spec.model_dump())):
        for secret in ("AKIAEXAMPLE", "hunter2-secret", "tok-123"):
            assert secret not in shown
    assert "http://minio:9000" in repr(spec)  # not credentials: still visible
    with pytest.raises(ValidationError) as info:  # nor in validation errors
        JobSpec.from_dict(spec_data(input={"storage_options": options}, kind="bad"))
    assert "hunter2" not in str(format_errors(info.value, JobSpec))
    plan = spec.to_plan("j1")
    assert plan.storage_options == options  # the filesystem gets the real values
    assert JobSpec.from_dict(spec.to_data()).to_plan("j1") == plan


def test_schedules() -> None:
    assert parse_schedule("*/5 2 * * 1-5").cron == "*/5 2 * * 1-5"
    assert parse_schedule("@daily").cron == "0 0 * * *"
    assert parse_schedule("every 2s").seconds == 2
    assert parse_schedule("every 10 minutes").seconds == 600
    assert parse_schedule("EVERY 1.5h").seconds == 5400
    for bad in ("* * * *", "0 0 * * * *", "every 0s", "every 5 fortnights", "sometimes"):
        with pytest.raises(ValueError):
            parse_schedule(bad)
    cron = parse_schedule("30 2 * * 0").celery()
    assert cron.minute == {30} and cron.hour == {2} and cron.day_of_week == {0}
    assert parse_schedule("every 3s").celery().run_every.total_seconds() == 3


def test_to_plan_summarize() -> None:
    spec = JobSpec.from_dict(spec_data(
        input={"id_field": "doc", "text_field": "body", "passthrough": ["title"], "format": "csv"},
        model={"name": "smollm2-135m-instruct", "max_num_seqs": 32, "dtype": "bfloat16"},
        prompt={"template": "Title: {title}\n{body}", "few_shot": [{"user": "u1", "assistant": "a1"}]},
        sampling={"max_tokens": 40, "stop": "\n\n"}, truncate_prompt=True,
    ))
    plan = spec.to_plan()
    assert isinstance(plan, JobPlan) and plan.job_id.startswith("t-") and len(plan.job_id) == len("t-") + 8
    assert (plan.kind, plan.input_url, plan.output_url, plan.input_format) == ("summarize", "/data/in/", "/data/out/", "csv")
    assert (plan.id_field, plan.text_field, plan.passthrough_fields) == ("doc", "body", ["title"])
    assert plan.engine_settings == {"model": "smollm2-135m-instruct", "max_num_seqs": 32, "dtype": "bfloat16"}
    assert plan.sampling["max_tokens"] == 40 and plan.sampling["stop"] == ["\n\n"] and plan.sampling["temperature"] == 0
    assert plan.prompt.user_template == "Title: {title}\n{body}" and plan.prompt.system.startswith("Summarize")
    assert plan.prompt.few_shot == [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"}]
    assert plan.truncate_prompt and not plan.openai_output and plan.kind_stages().row_stage(plan) is None
    assert JobPlan.from_dict(plan.to_dict()) == plan  # JSON-safe round trip
    assert spec.to_plan(plan.job_id, read_only=True) == plan  # what status builds: the same plan
    # engine settings left unset are not sent: the worker's engine defaults apply
    assert JobSpec.from_dict(spec_data()).to_plan("x").engine_settings == {"model": "smollm2-135m-instruct"}
    assert JobSpec.from_dict(spec_data(input={"text_field": "body"})).to_plan("x").prompt.user_template == "{body}"


def test_model_and_sampling_tables_follow_the_engine() -> None:
    """[model] and [sampling] have a key per EngineConfig / SamplingParams field; the batch defaults
    (and so the plan's sampling, part of every part's fingerprint) are what they always were."""
    from engine import EngineConfig, SamplingParams
    from engine.model_registry import DEFAULT_MODEL
    from jobs.engine_sections import PER_REQUEST_SAMPLING, ModelSection, SamplingSection

    assert set(ModelSection.model_fields) == {"name", "path"} | {f.name for f in fields(EngineConfig)} - {"model"}
    assert set(SamplingSection.model_fields) == {f.name for f in fields(SamplingParams)} - PER_REQUEST_SAMPLING
    spec = JobSpec.from_dict(spec_data())
    assert spec.model.model_dump(exclude_none=True) == {}  # unset: the worker's engine defaults apply
    assert spec.sampling.plan_values() == {"max_tokens": 128, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                                           "seed": None, "stop": [], "stop_token_ids": [], "ignore_eos": False}
    assert SamplingParams(**spec.sampling.plan_values()).greedy
    assert EngineConfig().model == DEFAULT_MODEL == spec.model.engine_settings()["model"]
    assert errors_of(spec_data(sampling={"logprobs": 2})) == ["sampling.logprobs: unknown field"]
    assert errors_of(spec_data(model={"model": "x"})) == ["model.model: unknown field"]


def test_to_plan_evaluate_and_generate() -> None:
    evaluate = JobSpec.from_dict(spec_data(kind="evaluate", evaluate={"method": "choice", "reference_field": "gold"}))
    plan = evaluate.to_plan("e")
    kind = plan.kind_stages()
    assert (kind.row_stage(plan).name, kind.summary_stage(plan).name) == ("jobs.scoring:score_row", "jobs.scoring:summarize_scores")
    assert plan.stage_options == {"reference_field": "gold", "method": "choice", "pattern": None}
    assert plan.extra_columns == {"reference": "string", "prediction": "string", "correct": "bool", "score": "float64"}
    assert "letter" in plan.prompt.system
    generate = JobSpec.from_dict(spec_data(kind="generate", prompt={"prompt_field": "q"}))
    plan = generate.to_plan("g")
    assert (plan.prompt.prompt_field, plan.text_field, plan.prompt.system) == ("q", "q", "")


def test_example_specs_load() -> None:
    paths = sorted((REPO / "examples").glob("*.toml")) + [REPO / "examples" / "demo" / "summarize.toml"]
    kinds = {JobSpec.from_file(p).kind for p in paths}
    assert kinds == set(KIND_NAMES)  # every kind has an example
    demo = JobSpec.from_file(REPO / "examples" / "demo" / "summarize.toml")
    assert demo.input.url == str(REPO / "examples" / "demo" / "docs") + "/"
    assert demo.sampling.max_tokens == 48 and demo.model.engine_settings()["model"] == "smollm2-135m-instruct"
    assert len((REPO / "examples/demo/docs/part-0.jsonl").read_text().splitlines()) == 6
    assert len((REPO / "examples/demo/docs/part-1.jsonl").read_text().splitlines()) == 6


def test_a_spec_can_name_the_packaged_gemma3() -> None:
    """gemma3-270m is registered like the default model: a spec naming it plans an engine for it."""
    spec = JobSpec.from_dict(spec_data(model={"name": "gemma3-270m"}))
    assert spec.to_plan("x").engine_settings == {"model": "gemma3-270m"}
