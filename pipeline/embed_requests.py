"""A request shape (``pipeline.kind_stages``): a row's text becomes one embedding request, and its vector the
row's ``embedding`` column (Arrow ``fixed_size_list<float32>[dimensions]``).

The text is the rendered user turn (the document itself, or ``prompt.template`` filled from
the row: a retrieval instruction in front of a query, say), tokenized as the model's tokenizer
does for any text (its BOS/EOS where it adds them) with special-token strings kept literal:
documents are data. Options (``plan.mode_options``): ``pooling``, ``normalize``,
``dimensions``, as ``engine.PoolingParams`` takes them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from engine import PoolingParams
from pipeline.plan import JobPlan
from pipeline.sub_requests import RowGroup, RowInputError, SubRequest

if TYPE_CHECKING:
    from pipeline.kind_stages import RowParams
    from pipeline.shard_engine import PromptEngine

EMBEDDING_COLUMN = "embedding"


def vector_type(dimensions: int) -> str:
    """The column's type name for ``pipeline.output_schema``."""
    return f"fixed_size_list<float32>[{dimensions}]"


class EmbedRequests:
    """``build``: the row's one embedding request; ``values``: its vector as the row's column."""

    columns: ClassVar[tuple[str, ...]] = (EMBEDDING_COLUMN,)

    def __init__(self, plan: JobPlan, engine: PromptEngine, row_params: RowParams | None = None) -> None:
        self.plan = plan
        self.engine = engine
        options = plan.mode_options
        self.params = PoolingParams(options.get("pooling"), options.get("normalize"), options.get("dimensions"))

    def build(self, fields: dict[str, Any], row: int, messages: list[dict[str, str]]) -> list[SubRequest]:
        text = messages[-1]["content"]
        if not text:
            raise RowInputError(f"row {row}: empty text, nothing to embed")
        ids = list(self.engine.tokenizer(text, split_special_tokens=True)["input_ids"])
        budget = self.engine.max_model_len - 1
        if len(ids) > budget:
            if not self.plan.truncate_prompt:
                raise RowInputError(f"row {row}: text is {len(ids)} tokens, over the {budget} that fit the "
                                    "context (set truncate_prompt = true to embed its beginning)")
            ids = ids[:budget]
        return [SubRequest(ids, self.params)]

    def values(self, group: RowGroup) -> dict[str, Any]:
        """The vector of a row without errors."""
        return {EMBEDDING_COLUMN: group.outputs[0].embedding.tolist()}
