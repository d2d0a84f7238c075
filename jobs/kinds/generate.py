"""Kind ``generate``: free-form prompts, one column holding each row's whole user turn.

No template: a column of prompts is sent as written (braces and all), so prompts that
contain code or JSON need no escaping. With ``[sampling] n`` > 1 the row keeps all its
samples (``samples``, a list column; ``output`` is the first) and their majority answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobs.kinds.base import JobKind, few_shot_turns
from jobs.sample_metrics import GENERATE_SAMPLE_COLUMNS, majority_row
from pipeline.kind_stages import Stage
from pipeline.plan import PromptPlan

if TYPE_CHECKING:
    from jobs.spec import JobSpec
    from pipeline.plan import JobPlan

MAJORITY = Stage("jobs.sample_metrics:majority_row", majority_row)


class Generate(JobKind):
    name = "generate"
    takes_samples = True

    def check(self, spec: JobSpec) -> None:
        if spec.prompt.template is not None:
            raise ValueError(
                "prompt.template: kind 'generate' sends prompt.prompt_field as written; "
                "use kind 'summarize' for a template"
            )
        clash = set(GENERATE_SAMPLE_COLUMNS) & set(spec.input.passthrough) if spec.sampling.n > 1 else set()
        if clash:
            raise ValueError(f"input.passthrough: {sorted(clash)} clash with the sample columns")

    @staticmethod
    def prompt_field(spec: JobSpec) -> str:
        return spec.prompt.prompt_field or spec.input.text_field

    def plan_fields(self, spec: JobSpec, *, read_only: bool = False) -> dict[str, Any]:
        field = self.prompt_field(spec)
        values: dict[str, Any] = {
            # the prompt column is also the checked text column: a row with an empty prompt is an error row
            "text_field": field,
            "prompt": PromptPlan(system=spec.prompt.system or "", prompt_field=field, few_shot=few_shot_turns(spec)),
        }
        if spec.sampling.n > 1:
            values.update(extra_columns=dict(GENERATE_SAMPLE_COLUMNS))
        return values

    def row_stage(self, plan: JobPlan) -> Stage | None:
        """With n samples, each row's majority answer."""
        return MAJORITY if int(plan.sampling.get("n", 1)) > 1 else None
