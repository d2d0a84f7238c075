"""Kind ``classify``: each document gets exactly one label from ``[classify] labels``.

Decoding is constrained (``engine.structured_output``) so only a label can come out: a
``choice`` over the labels, or with ``explain = true`` a regex ``(<label>|...): <reason>``,
the label first and a one-line reason after it. Label first, so the reason explains the
label the model chose rather than steering it, and a reason cut at ``max_tokens`` never
loses the label. The row gets a ``label`` column (and ``explain``); the manifest's summary
counts each label. A row the engine could not run (no text, too long) is an error row, and
so is an output that is no label (cut inside the label at ``max_tokens``): rows in = rows out.

This module is the whole kind: its options, spec rules, plan, row and summary stages and
console lines; nothing else names it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pydantic import Field, field_validator

from jobs.kinds.base import (
    JobKind,
    few_shot_turns,
    reject_passthrough_clash,
    reject_prompt_field,
    user_template,
)
from jobs.openai_merge import merge_if_requested
from jobs.sections import Section
from pipeline.kind_stages import RowRejected, Stage
from pipeline.plan import PromptPlan

if TYPE_CHECKING:
    from jobs.spec import JobSpec
    from pipeline.plan import JobPlan

LABEL, EXPLAIN = "label", "explain"  # the result columns
SEPARATOR = ": "  # between the label and its reason
DEFAULT_SYSTEM = "Classify the user's text with exactly one of these labels: {labels}. Reply with the label only."
DEFAULT_SYSTEM_EXPLAIN = ("Classify the user's text with exactly one of these labels: {labels}. Reply with the "
                          "label, then ': ' and a one-sentence reason.")
_REGEX_SPECIAL = set("\\.^$|?*+()[]{}")


class ClassifyOptions(Section):
    """``[classify]``: the labels, and whether each row also gets a reason."""

    labels: list[str] = Field(min_length=2, description="the labels a document may get (at least 2)")
    explain: bool = Field(False, description="also write a short reason after the label, in column 'explain'")

    @field_validator("labels")
    @classmethod
    def _distinct_labels(cls, labels: list[str]) -> list[str]:
        for label in labels:
            if not label.strip() or label != label.strip() or "\n" in label or SEPARATOR in label:
                raise ValueError(f"label {label!r}: must be non-empty, on one line, without surrounding "
                                 f"spaces or {SEPARATOR!r}")
        if len(set(labels)) != len(labels):
            raise ValueError("labels must be distinct")
        return labels


def _literal(text: str) -> str:
    return "".join("\\" + c if c in _REGEX_SPECIAL else c for c in text)


def constraint(labels: list[str], explain: bool) -> dict[str, Any]:
    """The structured output that lets only a label (then its reason) come out."""
    if not explain:
        return {"choice": list(labels)}
    return {"regex": "(" + "|".join(_literal(label) for label in labels) + ")" + SEPARATOR + "[^\\n]+"}


def label_row(row: dict[str, Any], record_fields: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """Row stage: the output's label (and reason); an output that holds no label is rejected."""
    if row.get("error"):
        return {}
    text = row.get("output") or ""
    explain = bool(options.get(EXPLAIN))
    for label in sorted(options["labels"], key=len, reverse=True):  # "neg" must not shadow "negative"
        if not explain and text == label:
            return {LABEL: label}
        if explain and text.startswith(label + SEPARATOR):
            return {LABEL: label, EXPLAIN: text[len(label) + len(SEPARATOR):].strip()}
    cut = " (cut at max_tokens)" if row.get("finish_reason") == "length" else ""
    raise RowRejected(f"output {text[:80]!r} is not one of the labels{cut}")


def summarize_labels(table: pa.Table, options: dict[str, Any]) -> dict[str, Any]:
    """Summary stage: rows per label, in the options' order."""
    rows = table.num_rows
    counts = {label: 0 for label in options["labels"]}
    if rows:
        for label in table.column(LABEL).to_pylist():
            if label is not None:
                counts[label] = counts.get(label, 0) + 1
    labeled = sum(counts.values())
    summary: dict[str, Any] = {"rows": rows, "labeled": labeled, "errors": rows - labeled, "labels": counts}
    merged = merge_if_requested(options)
    if merged:
        summary["openai_output"] = merged
    return summary


ROW = Stage("jobs.kinds.classify:label_row", label_row)
SUMMARY = Stage("jobs.kinds.classify:summarize_labels", summarize_labels)


def columns(options: ClassifyOptions) -> dict[str, str]:
    return {LABEL: "string", **({EXPLAIN: "string"} if options.explain else {})}


class Classify(JobKind):
    name = "classify"
    Options = ClassifyOptions

    def check(self, spec: JobSpec) -> None:
        reject_prompt_field(spec)
        if getattr(spec, self.name) is None:
            raise ValueError("classify: kind 'classify' needs a [classify] table with the labels")
        reject_passthrough_clash(spec, columns(self.options(spec)), "classify")

    def plan_fields(self, spec: JobSpec, *, read_only: bool = False) -> dict[str, Any]:
        options: ClassifyOptions = self.options(spec)
        system = spec.prompt.system
        if system is None:
            system = (DEFAULT_SYSTEM_EXPLAIN if options.explain else DEFAULT_SYSTEM).format(labels=", ".join(options.labels))
        sampling = spec.sampling.plan_values()
        sampling["structured_output"] = constraint(options.labels, options.explain)
        return {
            "prompt": PromptPlan(system=system, user_template=user_template(spec), few_shot=few_shot_turns(spec)),
            "sampling": sampling,
            "stage_options": {"labels": list(options.labels), EXPLAIN: options.explain},
            "extra_columns": columns(options),
        }

    def row_stage(self, plan: JobPlan) -> Stage:
        return ROW

    def summary_stage(self, plan: JobPlan) -> Stage:
        return SUMMARY

    def console_lines(self, summary: dict[str, Any]) -> list[tuple[str, str]]:
        if not isinstance(summary.get("labels"), dict):
            return []
        counts = ", ".join(f"{label} {count:,}" for label, count in summary["labels"].items())
        return [("labels", f"{counts} ({summary['labeled']:,}/{summary['rows']:,} rows labeled)")]
