"""Kind ``perplexity``: how well the model predicts each document (no generation).

Each row's text is scored token by token (``pipeline.loglikelihood.DocumentScoring``): the row gets its
summed negative log-likelihood ``nll`` (nats), its token count ``tokens`` and its own
``perplexity``; the manifest's summary holds the corpus perplexity, exp(sum nll / sum tokens),
which weights every token alike (not the mean of the rows' perplexities).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from jobs.kinds.base import JobKind, reject_passthrough_clash, reject_prompt
from pipeline.kind_stages import Stage
from pipeline.loglikelihood import DocumentScoring
from pipeline.plan import PromptPlan

if TYPE_CHECKING:
    from jobs.spec import JobSpec
    from pipeline.plan import JobPlan
    from pipeline.row_requests import RowGroup

COLUMNS = {"nll": "float64", "tokens": "int64", "perplexity": "float64"}
MODE = "perplexity"  # the request mode: every token of the document scored


class DocumentPerplexity(DocumentScoring):
    """The document's scores, and its own perplexity from them."""

    columns: ClassVar[tuple[str, ...]] = tuple(COLUMNS)

    def values(self, group: RowGroup) -> dict[str, Any]:
        values = super().values(group)
        return {**values, "perplexity": math.exp(values["nll"] / values["tokens"])}


class Perplexity(JobKind):
    name = "perplexity"
    shapes = {MODE: DocumentPerplexity}

    def check(self, spec: JobSpec) -> None:
        reject_prompt(spec, "scores input.text_field as it is, with no prompt")
        reject_passthrough_clash(spec, COLUMNS, "perplexity")

    def plan_fields(self, spec: JobSpec, *, read_only: bool = False) -> dict[str, Any]:
        return {
            "prompt": PromptPlan(prompt_field=spec.input.text_field),  # rendered but unused: the text is scored raw
            "request_mode": MODE,
            "extra_columns": dict(COLUMNS),
        }

    def summary_stage(self, plan: JobPlan) -> Stage:
        return SUMMARY

    def console_lines(self, summary: dict[str, Any]) -> list[tuple[str, str]]:
        if summary.get("perplexity") is None:
            return []
        return [("corpus perplexity", f"{summary['perplexity']:.3f} ({summary['tokens']:,} tokens)")]


def summarize(table: pa.Table, options: dict[str, Any]) -> dict[str, Any]:
    """Summary stage: corpus perplexity over the rows that were scored."""
    rows = table.num_rows
    errors = rows - len(table.filter(pc.is_null(table.column("error")))) if rows else 0
    nll = float(pc.sum(table.column("nll")).as_py() or 0.0) if rows else 0.0
    tokens = int(pc.sum(table.column("tokens")).as_py() or 0) if rows else 0
    return {
        "rows": rows,
        "scored": rows - errors,
        "errors": errors,
        "tokens": tokens,
        "nll": round(nll, 4),
        "nll_per_token": round(nll / tokens, 6) if tokens else None,
        "perplexity": round(math.exp(nll / tokens), 4) if tokens else None,
    }


SUMMARY = Stage("jobs.kinds.perplexity:summarize", summarize)
