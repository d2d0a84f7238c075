"""Kind ``harness_requests``: rows that are lm-evaluation-harness requests, tokenized already.

``harness.fleet_model`` writes one row per distinct request of a harness call (its token
ids: a scored span or a prompt to generate from, ``pipeline.token_requests``) and submits
this kind to the fleet; the parts hold each request's ``logprob`` and ``is_greedy`` or its
generated ``output``, and the harness computes its metrics from them. The harness, not the
job, owns prompts and tokenization, so a spec of this kind sets none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobs.kinds.base import JobKind, reject_passthrough_clash, reject_prompt
from pipeline.plan import PromptPlan
from pipeline.token_requests import COLUMNS, SAMPLING_FIELD, TokenRequests

if TYPE_CHECKING:
    from jobs.spec import JobSpec


MODE = "tokens"  # the request mode: rows carry token ids (pipeline.token_requests)


class HarnessRequests(JobKind):
    name = "harness_requests"
    shapes = {MODE: TokenRequests}
    errors_are_results = True  # lm-eval reads each request's error

    def check(self, spec: JobSpec) -> None:
        reject_prompt(spec, "rows carry their prompts as token ids")
        reject_passthrough_clash(spec, [*COLUMNS, SAMPLING_FIELD], "request")

    def plan_fields(self, spec: JobSpec, *, read_only: bool = False) -> dict[str, Any]:
        return {
            "prompt": PromptPlan(prompt_field=spec.input.text_field),  # rendered but unused: rows carry token ids
            "request_mode": MODE,
            "sampling_field": SAMPLING_FIELD,
            "extra_columns": dict(COLUMNS),
        }
