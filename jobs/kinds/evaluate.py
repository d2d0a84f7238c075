"""Kind ``evaluate``: rows carry a reference answer; every output is scored on the worker.

Few-shot examples go in the shared prefix, so the prefix cache serves them once for the
whole set (the manifest's ``prefix_cache_hit_tokens`` shows it). ``method =
"loglikelihood"`` generates nothing: each of the row's choices is scored by its
log-likelihood given the context (``jobs.mc_scoring``). With ``[sampling] n`` > 1 each
row's samples are kept in a list column and scored one by one (pass@k, majority vote).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobs.kinds.base import JobKind, few_shot_turns, reject_prompt_field, user_template
from jobs.mc_scoring import LL_COLUMNS
from jobs.scoring import EXTRA_COLUMNS, SAMPLE_COLUMNS
from jobs.sections import EvaluateSection
from pipeline.plan import PromptPlan, RequestMode

if TYPE_CHECKING:
    from jobs.spec import JobSpec

DEFAULT_SYSTEM = {
    "choice": "Answer the multiple-choice question with the letter of the correct option only.",
    "exact": "Answer the question with a short answer only.",
    "contains": "Answer the question briefly.",
    "regex": "Answer the question.",
    "loglikelihood": "Answer the question.",
}
_LL_ONLY = ("chat_template", "target_delimiter")


def section(spec: JobSpec) -> EvaluateSection:
    return spec.evaluate or EvaluateSection()


def columns(spec: JobSpec) -> dict[str, str]:
    evaluate = section(spec)
    if evaluate.method == "loglikelihood":
        return dict(LL_COLUMNS)
    return {**EXTRA_COLUMNS, **(SAMPLE_COLUMNS if spec.sampling.n > 1 else {})}


class Evaluate(JobKind):
    name = "evaluate"

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
        fields: dict[str, Any] = {"prompt": prompt, "report_hook": "jobs.report:write_report",
                                  "extra_columns": columns(spec)}
        if evaluate.method == "loglikelihood":
            mode_options: dict[str, Any] = {"choices_field": evaluate.choices_field, "chat_template": evaluate.chat_template}
            if evaluate.target_delimiter is not None:
                mode_options["target_delimiter"] = evaluate.target_delimiter
            return {
                **fields, "request_mode": RequestMode.LOGLIKELIHOOD, "mode_options": mode_options,
                "row_hook": "jobs.mc_scoring:score_ll_row", "summary_hook": "jobs.mc_scoring:summarize_ll",
                "hook_options": {**options, "choices_field": evaluate.choices_field,
                                 "bootstrap_iters": evaluate.bootstrap_iters},
            }
        if spec.sampling.n > 1:
            options.update(n=spec.sampling.n, pass_k=list(evaluate.pass_k))
        return {**fields, "row_hook": "jobs.scoring:score_row", "summary_hook": "jobs.scoring:summarize_scores",
                "hook_options": options}
