"""Kind ``evaluate``: rows carry a reference answer; every output is scored on the worker.

Few-shot examples go in the shared prefix, so the prefix cache serves them once for the
whole set (the manifest's ``prefix_cache_hit_tokens`` shows it). ``method =
"loglikelihood"`` generates nothing: each of the row's choices is scored by its
log-likelihood given the context (``jobs.mc_scoring``). With ``[sampling] n`` > 1 each
row's samples are kept in a list column and scored one by one (pass@k, majority vote).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from jobs.kinds.base import JobKind, few_shot_turns, reject_prompt_field, user_template
from jobs.mc_scoring import LL_COLUMNS, score_ll_row, summarize_ll
from jobs.report import write_report
from jobs.scoring import EXTRA_COLUMNS, SAMPLE_COLUMNS, score_row, summarize_scores
from jobs.sections import Section
from pipeline.kind_stages import Stage
from pipeline.loglikelihood import ChoiceScoring
from pipeline.plan import PromptPlan

if TYPE_CHECKING:
    from jobs.spec import JobSpec
    from pipeline.plan import JobPlan

DEFAULT_SYSTEM = {
    "choice": "Answer the multiple-choice question with the letter of the correct option only.",
    "exact": "Answer the question with a short answer only.",
    "contains": "Answer the question briefly.",
    "regex": "Answer the question.",
    "loglikelihood": "Answer the question.",
}
_LL_ONLY = ("chat_template", "target_delimiter")
LOGLIKELIHOOD = "loglikelihood"  # the request mode: one request per choice, scored (pipeline.loglikelihood)
SCORE_ROW = Stage("jobs.scoring:score_row", score_row)
SCORE_SUMMARY = Stage("jobs.scoring:summarize_scores", summarize_scores)
LL_ROW = Stage("jobs.mc_scoring:score_ll_row", score_ll_row)
LL_SUMMARY = Stage("jobs.mc_scoring:summarize_ll", summarize_ll)
REPORT = Stage("jobs.report:write_report", write_report)


class EvaluateOptions(Section):
    """``[evaluate]``: where the reference is and how an answer is scored."""

    reference_field: str = Field("answer", min_length=1, description="input column with the expected answer")
    method: Literal["exact", "choice", "contains", "regex", "loglikelihood"] = "exact"
    pattern: str | None = Field(None, description="method 'regex': extracts the answer (group 1, or the match)")
    choices_field: str = Field("choices", min_length=1, description="method 'loglikelihood': the list of choices")
    chat_template: bool = Field(True, description="method 'loglikelihood': context in the chat template, else text")
    target_delimiter: str | None = Field(
        None, description="method 'loglikelihood': between context and choice (default '' in chat, ' ' in text)"
    )
    bootstrap_iters: int = Field(1000, ge=10, le=100_000, description="resamples for the standard errors")
    pass_k: list[int] = Field(default_factory=list, description="with sampling.n > 1: k values (default [1, n])")

    @field_validator("pass_k")
    @classmethod
    def _positive(cls, ks: list[int]) -> list[int]:
        if any(k < 1 for k in ks):
            raise ValueError("k values must be >= 1")
        return ks

    @field_validator("pattern")
    @classmethod
    def _compiles_pattern(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"not a valid regular expression: {exc}") from None
        return pattern


def section(spec: JobSpec) -> EvaluateOptions:
    return Evaluate().options(spec)


def columns(spec: JobSpec) -> dict[str, str]:
    evaluate = section(spec)
    if evaluate.method == "loglikelihood":
        return dict(LL_COLUMNS)
    return {**EXTRA_COLUMNS, **(SAMPLE_COLUMNS if spec.sampling.n > 1 else {})}


class Evaluate(JobKind):
    name = "evaluate"
    Options = EvaluateOptions
    shapes = {LOGLIKELIHOOD: ChoiceScoring}
    takes_samples = True

    def check(self, spec: JobSpec) -> None:
        reject_prompt_field(spec)
        evaluate = section(spec)
        if evaluate.method == "regex" and not evaluate.pattern:
            raise ValueError("evaluate.pattern: required when method = 'regex'")
        if evaluate.method != "regex" and evaluate.pattern is not None:
            raise ValueError(f"evaluate.pattern: only used by method 'regex' (method is {evaluate.method!r})")
        if evaluate.method == "loglikelihood":
            if spec.sampling.n > 1:
                raise ValueError("sampling.n: method 'loglikelihood' scores the choices, it samples nothing")
            if evaluate.pass_k:
                raise ValueError("evaluate.pass_k: needs sampling.n > 1, not used by method 'loglikelihood'")
        else:
            for name in _LL_ONLY:
                if name in evaluate.model_fields_set:
                    raise ValueError(f"evaluate.{name}: only used by method 'loglikelihood'")
            if any(k > spec.sampling.n for k in evaluate.pass_k):
                raise ValueError(f"evaluate.pass_k: every k must be <= sampling.n ({spec.sampling.n})")
        clash = set(columns(spec)) & set(spec.input.passthrough)
        if clash:
            raise ValueError(f"input.passthrough: {sorted(clash)} clash with the evaluation columns")

    def plan_fields(self, spec: JobSpec, *, read_only: bool = False) -> dict[str, Any]:
        evaluate = section(spec)
        system = DEFAULT_SYSTEM[evaluate.method] if spec.prompt.system is None else spec.prompt.system
        prompt = PromptPlan(system=system, user_template=user_template(spec), few_shot=few_shot_turns(spec))
        options = {"reference_field": evaluate.reference_field, "method": evaluate.method, "pattern": evaluate.pattern}
        fields: dict[str, Any] = {"prompt": prompt, "extra_columns": columns(spec)}
        if evaluate.method == "loglikelihood":
            mode_options: dict[str, Any] = {"choices_field": evaluate.choices_field, "chat_template": evaluate.chat_template}
            if evaluate.target_delimiter is not None:
                mode_options["target_delimiter"] = evaluate.target_delimiter
            return {
                **fields, "request_mode": LOGLIKELIHOOD, "mode_options": mode_options,
                "stage_options": {**options, "choices_field": evaluate.choices_field,
                                 "bootstrap_iters": evaluate.bootstrap_iters},
            }
        if spec.sampling.n > 1:
            options.update(n=spec.sampling.n, pass_k=list(evaluate.pass_k))
        return {**fields, "stage_options": options}

    # Choices scored by log-likelihood, else generated answers scored against the reference
    # (the scorers also join the OpenAI lines when asked).
    def row_stage(self, plan: JobPlan) -> Stage:
        return LL_ROW if plan.request_mode == LOGLIKELIHOOD else SCORE_ROW

    def summary_stage(self, plan: JobPlan) -> Stage:
        return LL_SUMMARY if plan.request_mode == LOGLIKELIHOOD else SCORE_SUMMARY

    def report_stage(self, plan: JobPlan) -> Stage:
        return REPORT

    def console_lines(self, summary: dict[str, Any]) -> list[tuple[str, str]]:
        lines = []
        if summary.get("accuracy") is not None:
            lines.append(("accuracy", f"{summary['accuracy']:.1%} ({summary['correct']}/{summary['scored']} scored)"))
        if summary.get("acc_norm") is not None:
            lines.append(("acc_norm", f"{summary['acc_norm']:.1%} (± {summary.get('acc_norm_stderr')} bootstrap s.e.)"))
        if summary.get("pass_at_k"):
            lines.append(("pass@k", ", ".join(f"pass@{k} {v:.1%}" for k, v in summary["pass_at_k"].items())))
        return lines
