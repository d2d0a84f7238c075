"""Kind ``embed``: every row's text becomes one vector, the ``embedding`` column of the output
(Parquet ``fixed_size_list<float32>[dimensions]``), for retrieval indexes, deduplication and
clustering.

Nothing is generated: each text runs through the model once, its final hidden states pooled
(``pipeline.embed_requests``, ``engine.pooling``). ``[embed]`` sets the pooling (default: the
model's sentence-transformers files, else the last token), ``normalize`` and ``dimensions``
(Matryoshka truncation). ``prompt.template`` may put an instruction in front of the text; no
chat template is applied. A row that cannot be embedded is an error row: rows in = rows out.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from jobs.kinds.base import JobKind, reject_passthrough_clash, user_template
from jobs.sections import Section
from pipeline.embed_requests import EMBEDDING_COLUMN, EmbedRequests, vector_type
from pipeline.plan import PromptPlan

if TYPE_CHECKING:
    from jobs.spec import JobSpec


MODE = "embed"  # the request mode: the row's text pooled into one vector (pipeline.embed_requests)


class EmbedOptions(Section):
    """``[embed]``: how a text's hidden states become its vector."""

    pooling: Literal["last", "mean", "cls"] | None = Field(None, description="default: as the model says, else last")
    normalize: bool | None = Field(None, description="L2-normalise (default: as the model says, else true)")
    dimensions: int | None = Field(None, ge=1, description="keep the first N values (Matryoshka models)")


def model_hidden_size(spec: JobSpec) -> int:
    """The model's hidden size, from its config (the vector's length without ``dimensions``)."""
    from engine.model_registry import resolve_model

    config = json.loads((resolve_model(spec.model.engine_settings()["model"]) / "config.json").read_text())
    return int(config.get("hidden_size") or config["text_config"]["hidden_size"])


class Embed(JobKind):
    name = "embed"
    Options = EmbedOptions
    shapes = {MODE: EmbedRequests}

    def check(self, spec: JobSpec) -> None:
        why = "embeds the text (or prompt.template) as it is, with no chat"
        for name in ("system", "prompt_field"):
            if getattr(spec.prompt, name) is not None:
                raise ValueError(f"prompt.{name}: kind 'embed' {why}")
        if spec.prompt.few_shot:
            raise ValueError(f"prompt.few_shot: kind 'embed' {why}")
        if spec.output.openai_format:
            raise ValueError("output.openai_format: kind 'embed' writes vectors, not OpenAI completion lines")
        reject_passthrough_clash(spec, [EMBEDDING_COLUMN], "embed")

    def plan_fields(self, spec: JobSpec, *, read_only: bool = False) -> dict[str, Any]:
        section = self.options(spec)
        hidden = model_hidden_size(spec)
        if section.dimensions is not None and section.dimensions > hidden:
            raise ValueError(f"embed.dimensions: at most the model's hidden size {hidden}, got {section.dimensions}")
        return {
            "prompt": PromptPlan(user_template=user_template(spec)),
            "request_mode": MODE,
            "mode_options": section.model_dump(exclude_none=True),
            "extra_columns": {EMBEDDING_COLUMN: vector_type(section.dimensions or hidden)},
        }
