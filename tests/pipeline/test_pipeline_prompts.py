"""Prompt templates, job kinds' steps, output schema and manifest hygiene: no engine needed."""

from __future__ import annotations

import importlib
import json
import re

import pytest

from jobs.kinds import KIND_NAMES
from pipeline.manifest import build_manifest, public_url
from pipeline.output_schema import SchemaError, output_schema
from pipeline.plan import JobPlan, PromptPlan
from pipeline.prompts import TemplateError, prefix_key, render_messages, validate_prompt, validate_template
from pipeline.shard_outcome import ShardOutcome


@pytest.mark.parametrize(
    "template, message",
    [
        ("{document.__class__}", "prompt template: field '{document.__class__}' is not a plain field name"),
        ("{0}", "field '{0}' is not a plain field name"),
        ("{}", "field '{}' is not a plain field name"),
        ("{x[0]}", "field '{x[0]}' is not a plain field name"),
        ("{x!r}", "field '{x!r}' has a conversion or format spec"),
        ("{x:>10}", "field '{x:>10}' has a conversion or format spec"),
        ("Summarize {text", "write '{{' or '}}' for a literal brace"),
        ("oops }", "write '{{' or '}}' for a literal brace"),
    ],
)
def test_unsafe_templates_are_rejected(template: str, message: str) -> None:
    with pytest.raises(TemplateError) as exc:
        validate_template(template)
    assert message in str(exc.value)


def test_plain_fields_and_literal_braces() -> None:
    assert validate_template("Summarize {text} in {lang}. {{json}}") == ["text", "lang"]
    prompt = PromptPlan(system="Be brief.", user_template="Doc: {text} {{x}} ({lang})")
    messages = render_messages(prompt, {"text": "hello", "lang": 3}, row=4)
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Doc: hello {x} (3)"},
    ]


def test_format_is_never_used_on_row_values() -> None:
    prompt = PromptPlan(user_template="{text}")
    (user,) = render_messages(prompt, {"text": "{text.__class__} {0}"})
    assert user["content"] == "{text.__class__} {0}"


def test_missing_field_names_the_row() -> None:
    prompt = PromptPlan(user_template="{text} / {title}")
    with pytest.raises(TemplateError, match=r"^row 7: template field 'title' missing$"):
        render_messages(prompt, {"text": "x"}, row=7)


def test_shared_prefix_with_few_shot() -> None:
    few = [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"}]
    prompt = PromptPlan(system="S", few_shot=few, user_template="{text}")
    a = render_messages(prompt, {"text": "one"})
    b = render_messages(prompt, {"text": "two"})
    assert a[:3] == b[:3] == [{"role": "system", "content": "S"}, *few]
    assert prefix_key(a) == prefix_key(b)


def test_prompt_field_and_messages_field() -> None:
    gen = PromptPlan(system="S", prompt_field="prompt")
    assert render_messages(gen, {"prompt": "{not a template}"})[-1]["content"] == "{not a template}"
    batch = PromptPlan(messages_field="body")
    body = {"messages": [{"role": "system", "content": "own"}, {"role": "user", "content": "hi"}]}
    assert render_messages(batch, {"body": body}) == body["messages"]
    with pytest.raises(TemplateError, match="row 2: field 'body' is not a non-empty list"):
        render_messages(batch, {"body": {"messages": []}}, row=2)


def test_bad_few_shot_is_rejected() -> None:
    with pytest.raises(TemplateError, match="few_shot"):
        validate_prompt(PromptPlan(few_shot=[{"role": "robot", "content": "x"}]))


@pytest.mark.parametrize("kind", [
    "os:system", "jobsx.mod:f", "jobs:f", "jobs.mod", "jobs.mod:f.g", "../jobs.m:f", "jobs.api:run",
    "jobs.cli:main", "jobs.scoring:score_row", "jobs.kinds.evaluate", "base", "JobKind", "Summarize", "",
])
def test_a_plan_naming_an_unknown_kind_is_refused(kind: str) -> None:
    """A plan names its kind, never code: only a kind of the in-process registry is accepted,
    whether the plan is built here or read back from the broker."""
    message = f"^unknown job kind {re.escape(repr(kind))}: expected one of {', '.join(KIND_NAMES)}$"
    with pytest.raises(ValueError, match=message):
        _plan(kind=kind)
    with pytest.raises(ValueError, match=message):
        JobPlan.from_dict({**_plan().to_dict(), "kind": kind})


def test_hook_names_of_earlier_plans_run_nothing() -> None:
    """A plan dict from before the kinds owned their steps still reads; the hooks it names are
    ignored: the kind decides its steps."""
    data = {**_plan().to_dict(), "row_hook": "os:system", "summary_hook": "jobs.api:run", "report_hook": "os:system"}
    plan = JobPlan.from_dict(data)
    assert (plan.kind_stages().row_stage(plan), plan.kind_stages().summary_stage(plan), plan.kind_stages().report_stage(plan)) == (None,) * 3
    assert plan.part_fingerprint("x") == _plan().part_fingerprint("x")


@pytest.mark.parametrize("plan_values", [
    *({"kind": name} for name in KIND_NAMES),
    {"kind": "evaluate", "request_mode": "loglikelihood"},
    {"kind": "generate", "sampling": {"n": 3}},
    {"kind": "summarize", "openai_output": True, "stage_options": {"openai_output": True}},
])
def test_every_kind_step_is_the_function_it_names(plan_values) -> None:
    """A step's name (in fingerprints and manifests) still names the function that runs."""
    plan = _plan(**plan_values)
    kind = plan.kind_stages()
    for step in (kind.row_stage(plan), kind.summary_stage(plan), kind.report_stage(plan)):
        if step is not None:
            module, function = step.name.split(":")
            assert getattr(importlib.import_module(module), function) is step.run


def _plan(**kw) -> JobPlan:
    return JobPlan(**{"job_id": "j", "name": "n", "kind": "summarize", "input_url": "/in", "output_url": "/out", **kw})


def test_output_schema_columns_and_clashes() -> None:
    schema = output_schema(_plan(passthrough_fields=["lang"], extra_columns={"score": "float64", "ok": "bool"}))
    assert schema.names == [
        "id", "lang", "output", "finish_reason", "prompt_tokens", "output_tokens", "cached_prompt_tokens",
        "error", "latency_s", "content_key", "score", "ok",
    ]
    with pytest.raises(SchemaError):
        output_schema(_plan(passthrough_fields=["output"]))
    with pytest.raises(SchemaError):
        output_schema(_plan(extra_columns={"error": "string"}))
    with pytest.raises(SchemaError):
        output_schema(_plan(extra_columns={"x": "decimal"}))


def test_manifest_has_no_credentials() -> None:
    plan = _plan(
        storage_options={"key": "AKIA-SENTINEL", "secret": "SECRET-SENTINEL"},
        stage_options={"api_key": "HOOK-SENTINEL"},
    )
    plan.output_url = "s3://user:PASS-SENTINEL@bucket/out"
    result = {"index": 0, "url": "s3://b/x.jsonl", "status": "done", "rows": 1, "errors": 0, "reason": None,
              "prompt_tokens": 3, "output_tokens": 2, "cached_prompt_tokens": 0, "seconds": 1.0, "worker": "w"}
    outcome = ShardOutcome.from_result_dict(result)
    text = json.dumps(build_manifest(plan, [outcome], mode="embedded", started_at="t", elapsed_s=1.0))
    for secret in ("AKIA-SENTINEL", "SECRET-SENTINEL", "HOOK-SENTINEL", "PASS-SENTINEL"):
        assert secret not in text
    assert public_url("s3://user:pw@bucket/out") == "s3://bucket/out"
