"""How one input row becomes engine requests, and how their outputs become one result row.

Most kinds send one request per row, a generation (with ``n`` samples it is still one
request, the engine shares the prompt's KV blocks between the samples). A kind may give its
own request shape for the plan's request mode (``KindStages.request_shape``): the shapes the
pipeline offers score text instead of generating it (``pipeline.loglikelihood``), pool it
into a vector (``pipeline.embed_requests``) or take token ids (``pipeline.token_requests``).
A row may also carry its own sampling settings (OpenAI batch lines: ``plan.sampling_field``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.sampling_params import SamplingParams
from pipeline.openai_output import logprobs_content
from pipeline.plan import JobPlan
from pipeline.result_row import OpenAIChoice, RequestResult
from pipeline.shard_engine import PromptEngine
from pipeline.sub_requests import RowGroup, RowInputError, SubRequest, make_params


def _choice(out: Any, tokenizer: Any, top: int | None) -> OpenAIChoice:
    content = None
    if top is not None and out.logprobs is not None:
        content = logprobs_content(out.token_ids, out.logprobs, top, tokenizer)
    return OpenAIChoice(out.index, out.text, out.finish_reason, content)


class RequestBuilder:
    """Per plan: ``build`` turns a row into SubRequests, ``row_values`` their outputs into its result."""

    def __init__(self, plan: JobPlan, engine: PromptEngine) -> None:
        self.plan = plan
        self.engine = engine
        self.base = dict(plan.sampling)
        self.params = make_params(self.base)
        shape = plan.kind_stages().request_shape(plan)
        self.scorer = None if shape is None else shape(plan, engine, self.row_params)

    def row_params(self, fields: dict[str, Any], row: int) -> SamplingParams:
        name = self.plan.sampling_field
        own = fields.get(name) if name else None
        if not own:
            return self.params
        if not isinstance(own, dict):
            raise RowInputError(f"row {row}: field {name!r} must be an object of sampling settings")
        try:
            return make_params({**self.base, **own})
        except (TypeError, ValueError) as exc:
            raise RowInputError(f"row {row}: invalid sampling parameters: {exc}") from None

    def build(self, fields: dict[str, Any], row: int, messages: list[dict[str, str]],
              tokenize: Callable[[], list[int]]) -> list[SubRequest]:
        if self.scorer is not None:
            return self.scorer.build(fields, row, messages)
        return [SubRequest(tokenize(), self.row_params(fields, row))]

    def row_values(self, group: RowGroup) -> RequestResult:
        """A finished group's result: the fixed columns, plus the mode's columns."""
        outs = [group.outputs[i] for i in range(len(group.subs))]
        errors = [o.error for o in outs if o.error]
        values: dict[str, Any] = {
            "prompt_tokens": sum(len(o.prompt_token_ids) for o in outs),
            "cached_prompt_tokens": sum(o.metrics.num_cached_prompt_tokens for o in outs),
            "error": errors[0] if errors else None,
        }
        if self.scorer is not None:
            values.update(output=None, output_tokens=0, finish_reason="error" if errors else "stop")
            if not errors:
                values.update(self.scorer.values(group))
            return RequestResult.from_values(values)
        (out,) = outs
        samples = list(getattr(out, "outputs", None) or [])
        values.update(
            output=out.text, finish_reason=out.finish_reason,
            output_tokens=sum(len(s.token_ids) for s in samples) if samples else len(out.token_ids),
        )
        if "samples" in self.plan.extra_columns:
            values["samples"] = [s.text for s in samples] if samples else [out.text]
            values["sample_finish_reasons"] = [s.finish_reason for s in samples] if samples else [out.finish_reason]
        choices = None
        if self.plan.openai_output and samples and not errors:
            top = group.subs[0].params.logprobs
            choices = tuple(_choice(s, self.engine.tokenizer, top) for s in samples)
        return RequestResult.from_values(values, choices)
