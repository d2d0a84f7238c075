"""Scoring model answers against references: the ``evaluate`` kind's row and summary stages.

The pipeline calls ``score_row`` for every finished row (on the worker, so scores land in
the Parquet parts) and ``summarize_scores`` once over the small columns of all parts (the
manifest's ``summary``). Methods:

- ``exact``:    equal after normalisation (lowercase, no punctuation, no articles, one space)
- ``choice``:   the first standalone letter A-E in the output equals the reference letter
- ``contains``: the normalised reference appears as whole words in the normalised output
- ``regex``:    ``pattern`` extracts the answer (group 1, else the whole match), then ``exact``

A reference may be a list of acceptable answers; any one matching counts.

With ``n`` samples per row (``[sampling] n``) every sample is scored: ``correct`` is the
first sample's, ``score`` the fraction correct, and the summary adds pass@k (unbiased
estimator) and the accuracy of the majority vote over the samples' predictions.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from jobs.answer_text import normalize_answer
from jobs.openai_merge import merge_if_requested
from jobs.sample_metrics import majority, pass_at_k

CHOICE_LETTERS = "ABCDE"
_CHOICE = re.compile(r"(?<![A-Za-z0-9])([A-E])(?![A-Za-z0-9])")
_CHOICE_ANY_CASE = re.compile(r"(?<![A-Za-z0-9])([A-Ea-e])(?![A-Za-z0-9])")
MAX_PREDICTION_CHARS = 200
MAX_REFERENCE_GROUPS = 10  # per-reference accuracy only for label-like references (choice letters, yes/no)
EXTRA_COLUMNS = {"reference": "string", "prediction": "string", "correct": "bool", "score": "float64"}
SAMPLE_COLUMNS = {
    "samples": "list<string>", "sample_finish_reasons": "list<string>", "sample_correct": "list<bool>",
    "n_correct": "int64", "majority": "string", "majority_correct": "bool",
}


def extract_choice(text: str) -> str | None:
    """The first standalone capital letter A-E ('B', '(C)', 'D.', 'Answer: A'), else None.

    Only capitals count in outputs, so the article 'a' is not read as option A."""
    match = _CHOICE.search(text or "")
    return match.group(1) if match else None


def reference_choice(reference: Any) -> str | None:
    """A reference given as 'B', 'b', '(B) Paris' or a 0-based index."""
    if isinstance(reference, int) and not isinstance(reference, bool):
        return CHOICE_LETTERS[reference] if 0 <= reference < len(CHOICE_LETTERS) else None
    match = _CHOICE_ANY_CASE.search(str(reference).strip())
    return match.group(1).upper() if match else None


def extract_regex(text: str, pattern: str) -> str | None:
    match = re.search(pattern, text or "")
    if match is None:
        return None
    if match.re.groups:
        return match.group(1)
    return match.group(0)


def _contains(output: str, reference: str) -> bool:
    needle = normalize_answer(reference)
    return bool(needle) and f" {needle} " in f" {normalize_answer(output)} "


def score_answer(output: str, reference: Any, method: str, pattern: str | None = None) -> tuple[str | None, bool]:
    """(what was compared from the output, whether it is correct)."""
    references = reference if isinstance(reference, list) else [reference]
    if method == "choice":
        letters = {reference_choice(r) for r in references} - {None}
        if not letters:
            raise ValueError(f"reference {reference!r} is not a choice letter A-E")
        prediction = extract_choice(output)
        return prediction, prediction in letters
    if method == "contains":
        return normalize_answer(output), any(_contains(output, str(r)) for r in references)
    if method == "regex":
        if not pattern:
            raise ValueError("method 'regex' needs a pattern")
        prediction = extract_regex(output, pattern)
        if prediction is None:
            return None, False
    elif method == "exact":
        prediction = output
    else:
        raise ValueError(f"unknown scoring method {method!r}")
    normalized = normalize_answer(prediction)
    return normalized, any(normalized == normalize_answer(str(r)) for r in references)


def _reference_text(reference: Any) -> str:
    return reference if isinstance(reference, str) else json.dumps(reference, ensure_ascii=False)


def score_row(row: dict[str, Any], record_fields: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """Row stage: reference, prediction, correct, score. Rows that failed are not scored;
    a missing reference makes the row an error row (the pipeline reports the exception)."""
    name = options.get("reference_field", "answer")
    reference = record_fields.get(name)
    if reference is None or reference == "" or reference == []:
        raise ValueError(f"reference field {name!r} is missing or empty")
    values: dict[str, Any] = {"reference": _reference_text(reference)}
    if row.get("error"):
        return values
    method, pattern = options.get("method", "exact"), options.get("pattern")
    prediction, correct = score_answer(row.get("output") or "", reference, method, pattern)
    if prediction is not None:
        prediction = prediction[:MAX_PREDICTION_CHARS]
    values.update(prediction=prediction, correct=correct, score=1.0 if correct else 0.0)
    samples = row.get("samples")
    if samples is not None:
        scored = [score_answer(text or "", reference, method, pattern) for text in samples]
        vote = majority([p for p, _ in scored])
        vote_correct = vote is not None and next(ok for p, ok in scored if p == vote)
        values.update(
            sample_correct=[ok for _, ok in scored], n_correct=sum(ok for _, ok in scored),
            score=sum(ok for _, ok in scored) / len(scored),
            majority=None if vote is None else vote[:MAX_PREDICTION_CHARS], majority_correct=vote_correct,
        )
    return values


def _sample_summary(table: pa.Table, options: dict[str, Any]) -> dict[str, Any]:
    """pass@k for each requested k (mean over scored rows) and the majority vote's accuracy."""
    n = int(options.get("n", 1))
    counts = [c for c in table.column("n_correct").to_pylist() if c is not None]
    if not counts:
        return {"n": n}
    ks = sorted({k for k in options.get("pass_k") or [1, n] if 1 <= k <= n})
    votes = [v for v in table.column("majority_correct").to_pylist() if v is not None]
    return {
        "n": n,
        "pass_at_k": {str(k): round(sum(pass_at_k(n, c, k) for c in counts) / len(counts), 4) for k in ks},
        "majority_accuracy": round(sum(votes) / len(votes), 4) if votes else None,
    }


def _count(column: pa.ChunkedArray, value: Any = None) -> int:
    if value is None:
        return len(column) - column.null_count
    return int(pc.sum(pc.equal(column, value)).as_py() or 0)


def summarize_scores(table: pa.Table, options: dict[str, Any]) -> dict[str, Any]:
    """Summary stage: accuracy and counts over all parts; per-reference accuracy when few labels."""
    rows = table.num_rows
    errors = _count(table.column("error")) if rows else 0
    correct_col = table.column("correct")
    scored, correct = _count(correct_col), _count(correct_col, True) if rows else 0
    output_tokens = int(pc.sum(table.column("output_tokens")).as_py() or 0) if rows else 0
    latency = pc.mean(table.column("latency_s")).as_py() if rows else None
    busy = float(pc.sum(table.column("latency_s")).as_py() or 0.0) if rows else 0.0
    summary: dict[str, Any] = {
        "method": options.get("method", "exact"),
        "rows": rows,
        "scored": scored,
        "correct": correct,
        "incorrect": scored - correct,
        "errors": errors,
        "accuracy": round(correct / scored, 4) if scored else None,
        "output_tokens": output_tokens,
        "mean_latency_s": round(latency, 4) if latency is not None else None,
        # per request, from each row's latency; the job's throughput is engine_stats.output_tokens_per_s
        "tokens_per_s_per_request": round(output_tokens / busy, 2) if busy > 0 else None,
    }
    if scored:
        refs, oks = table.column("reference").to_pylist(), correct_col.to_pylist()
        totals = Counter(r for r, ok in zip(refs, oks, strict=True) if ok is not None)
        labels = summary["method"] == "choice" or (len(totals) <= MAX_REFERENCE_GROUPS and scored >= 2 * len(totals))
        if labels and len(totals) <= 2 * MAX_REFERENCE_GROUPS:
            hits = Counter(r for r, ok in zip(refs, oks, strict=True) if ok)
            summary["by_reference"] = {
                ref: {"scored": n, "correct": hits[ref], "accuracy": round(hits[ref] / n, 4)}
                for ref, n in sorted(totals.items())
            }
    if "n_correct" in table.column_names:
        summary.update(_sample_summary(table, options))
    merged = merge_if_requested(options)
    if merged:
        summary["openai_output"] = merged
    return summary
