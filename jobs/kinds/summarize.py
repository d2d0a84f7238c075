"""Kind ``summarize`` (the default): one shared instruction, then each document."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobs.kinds.base import JobKind, few_shot_turns, reject_prompt_field, user_template
from pipeline.plan import PromptPlan

if TYPE_CHECKING:
    from jobs.spec import JobSpec

DEFAULT_SYSTEM = "Summarize the following document in two or three sentences. Reply with the summary only."


class Summarize(JobKind):
    name = "summarize"

    def check(self, spec: JobSpec) -> None:
        reject_prompt_field(spec)

    def plan_fields(self, spec: JobSpec, *, read_only: bool = False) -> dict[str, Any]:
        system = DEFAULT_SYSTEM if spec.prompt.system is None else spec.prompt.system
        return {"prompt": PromptPlan(system=system, user_template=user_template(spec), few_shot=few_shot_turns(spec))}
