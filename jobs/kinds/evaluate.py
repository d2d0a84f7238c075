"""Kind ``evaluate``: rows carry a reference answer; every output is scored on the worker.

Few-shot examples go in the shared prefix, so the prefix cache serves them once for the
whole set (the manifest's ``prefix_cache_hit_tokens`` shows it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobs.kinds.base import few_shot_turns, reject_prompt_field, user_template
from jobs.scoring import EXTRA_COLUMNS
from jobs.sections import EvaluateSection
from pipeline.plan import PromptPlan

if TYPE_CHECKING:
    from jobs.spec import JobSpec

DEFAULT_SYSTEM = {
    "choice": "Answer the multiple-choice question with the letter of the correct option only.",
    "exact": "Answer the question with a short answer only.",
    "contains": "Answer the question briefly.",
    "regex": "Answer the question.",
}


def section(spec: JobSpec) -> EvaluateSection:
    return spec.evaluate or EvaluateSection()


def check(spec: JobSpec) -> None:
    reject_prompt_field(spec)
    evaluate = section(spec)
    if evaluate.method == "regex" and not evaluate.pattern:
        raise ValueError("evaluate.pattern: required when method = 'regex'")
    if evaluate.method != "regex" and evaluate.pattern is not None:
        raise ValueError(f"evaluate.pattern: only used by method 'regex' (method is {evaluate.method!r})")
    clash = set(EXTRA_COLUMNS) & set(spec.input.passthrough)
    if clash:
        raise ValueError(f"input.passthrough: {sorted(clash)} clash with the evaluation columns")


def plan_fields(spec: JobSpec) -> dict[str, Any]:
    evaluate = section(spec)
    system = DEFAULT_SYSTEM[evaluate.method] if spec.prompt.system is None else spec.prompt.system
    return {
        "prompt": PromptPlan(system=system, user_template=user_template(spec), few_shot=few_shot_turns(spec)),
        "row_hook": "jobs.scoring:score_row",
        "summary_hook": "jobs.scoring:summarize_scores",
        "report_hook": "jobs.report:write_report",
        "hook_options": {
            "reference_field": evaluate.reference_field, "method": evaluate.method, "pattern": evaluate.pattern,
        },
        "extra_columns": dict(EXTRA_COLUMNS),
    }
