"""Kind ``openai_batch``: an OpenAI Batch API input file in, batch output lines out.

The request file is converted into plain rows first (see ``jobs.openai_requests``): the
custom_id becomes the row id and each row carries its own messages and sampling settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobs.kinds.base import JobKind, few_shot_turns
from jobs.kinds.embed import MODE as EMBED_MODE
from jobs.kinds.embed import model_hidden_size
from jobs.openai_embeddings import embedding_line
from jobs.openai_requests import SAMPLING_FIELD, convert_requests
from jobs.secrets import reveal
from pipeline.embed_requests import EMBEDDING_COLUMN, EmbedRequests, vector_type
from pipeline.kind_stages import Stage
from pipeline.plan import PromptPlan

if TYPE_CHECKING:
    from jobs.spec import JobSpec
    from pipeline.plan import JobPlan


class OpenAIBatch(JobKind):
    name = "openai_batch"
    shapes = {EMBED_MODE: EmbedRequests}
    errors_are_results = True  # the batch's error file holds them
    input_format = "openai_batch"  # a request file, converted to rows before the job runs
    openai_output = True

    def check(self, spec: JobSpec) -> None:
        for name in ("template", "prompt_field"):
            if getattr(spec.prompt, name) is not None:
                raise ValueError(f"prompt.{name}: not used by kind 'openai_batch' (each request carries its messages)")
        for name in ("id_field", "text_field", "passthrough"):
            if name in spec.input.model_fields_set:
                raise ValueError(f"input.{name}: not used by kind 'openai_batch' (custom_id is the row id)")

    def plan_fields(self, spec: JobSpec, *, read_only: bool = False) -> dict[str, Any]:
        """Converts the request file (I/O); each request line carries its own sampling settings.
        Read-only, the converted rows are used only if an earlier run left exactly them under the
        output; otherwise the plan lists the request files themselves, none of them done yet."""
        in_options, out_options = reveal(spec.input.storage_options), spec.output_storage_options()
        converted = convert_requests(
            spec.input.full_url, spec.output.url, in_options,
            output_storage_options=out_options, write=not read_only,
        )
        if converted.current:  # the converted rows, under the output: read with its options
            input_url, storage_options = converted.url, in_options if out_options is None else out_options
        else:
            input_url, storage_options = spec.input.full_url, in_options
        fields: dict[str, Any] = {}
        if converted.embeddings:  # /v1/embeddings lines: each row's text pooled, its line from the row stage
            fields = {"request_mode": EMBED_MODE, "mode_options": {"normalize": True}, "stage_options": {"model": spec.model.engine_settings()["model"]},
                      "extra_columns": {EMBEDDING_COLUMN: vector_type(model_hidden_size(spec))}}
        return {
            **fields,
            "input_url": input_url,
            "storage_options": storage_options,
            "input_format": "jsonl",
            "id_field": "custom_id",
            "text_field": "text",
            "sampling": spec.sampling.plan_values(),
            "sampling_field": SAMPLING_FIELD,  # each line's own settings, over [sampling]
            "prompt": PromptPlan(system=spec.prompt.system or "", messages_field="messages",
                                 few_shot=few_shot_turns(spec), raw_prompt=converted.completions),
        }

    def row_stage(self, plan: JobPlan) -> Stage | None:
        return EMBEDDING_LINE if plan.request_mode == EMBED_MODE else None


EMBEDDING_LINE = Stage("jobs.openai_embeddings:embedding_line", embedding_line)
