"""Multiple choice by log-likelihood: the ``evaluate`` kind's stages for ``method = "loglikelihood"``.

The pipeline fills ``choice_logprobs`` (per choice, the summed logprob of its continuation
given the context; ``pipeline.loglikelihood``). Here each row gets its prediction two ways,
as lm-evaluation-harness reports them: ``acc`` takes the choice with the highest
log-likelihood, ``acc_norm`` the highest log-likelihood per UTF-8 byte of the choice text.
The summary adds a bootstrap standard error for both.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa

from jobs.scoring import CHOICE_LETTERS

LL_COLUMNS = {
    "reference": "string", "prediction": "string", "choice_logprobs": "list<float64>", "choice_tokens": "list<int64>",
    "gold": "int64", "pred": "int64", "pred_norm": "int64", "correct": "bool", "correct_norm": "bool",
    "score": "float64",
}
BOOTSTRAP_SEED = 1234


def gold_index(reference: Any, choices: list[str]) -> int:
    """The gold choice from a 0-based index, a letter ('B', or 'b'), or the choice's own text."""
    if isinstance(reference, bool):
        raise ValueError(f"reference {reference!r} is not a choice index, letter or text")
    if isinstance(reference, int):
        index = reference
    elif isinstance(reference, str) and reference in choices:
        index = choices.index(reference)
    elif isinstance(reference, str) and reference.strip().isdigit():
        index = int(reference.strip())
    elif isinstance(reference, str) and len(reference.strip()) == 1 and reference.strip().upper() in CHOICE_LETTERS:
        index = CHOICE_LETTERS.index(reference.strip().upper())
    else:
        raise ValueError(f"reference {reference!r} is not a choice index, letter or one of the choices")
    if not 0 <= index < len(choices):
        raise ValueError(f"reference {reference!r} is outside the {len(choices)} choices")
    return index


def _choices(record_fields: dict[str, Any], name: str) -> list[str]:
    value = record_fields.get(name)
    return json.loads(value) if isinstance(value, str) else list(value or [])


def score_ll_row(row: dict[str, Any], record_fields: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """Row stage: gold, pred, pred_norm, correct, correct_norm from the row's choice log-likelihoods."""
    name = options.get("reference_field", "answer")
    reference = record_fields.get(name)
    if reference is None or reference == "":
        raise ValueError(f"reference field {name!r} is missing or empty")
    values: dict[str, Any] = {"reference": reference if isinstance(reference, str) else json.dumps(reference)}
    if row.get("error"):
        return values
    choices = _choices(record_fields, options.get("choices_field", "choices"))
    gold = gold_index(reference, choices)
    lls = row["choice_logprobs"]
    pred = int(np.argmax(lls))
    pred_norm = int(np.argmax([ll / len(c.encode("utf-8")) for ll, c in zip(lls, choices, strict=True)]))
    values.update(
        prediction=choices[pred], gold=gold, pred=pred, pred_norm=pred_norm, correct=pred == gold,
        correct_norm=pred_norm == gold, score=1.0 if pred == gold else 0.0,
    )
    return values


def bootstrap_stderr(values: np.ndarray, iters: int, seed: int = BOOTSTRAP_SEED) -> float | None:
    """Standard deviation of the mean over ``iters`` resamples with replacement (fixed seed)."""
    if len(values) < 2:
        return None
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(iters, len(values)))].mean(axis=1)
    return float(means.std(ddof=1))


def summarize_ll(table: pa.Table, options: dict[str, Any]) -> dict[str, Any]:
    """Summary stage: acc and acc_norm with bootstrap standard errors (the report reads ``accuracy``)."""
    rows = table.num_rows
    correct = [v for v in table.column("correct").to_pylist()] if rows else []
    norm = [v for v in table.column("correct_norm").to_pylist()] if rows else []
    acc = np.array([v for v in correct if v is not None], dtype=float)
    acc_norm = np.array([v for v in norm if v is not None], dtype=float)
    iters = int(options.get("bootstrap_iters", 1000))
    errors = sum(e is not None for e in table.column("error").to_pylist()) if rows else 0

    def rounded(x: float | None) -> float | None:
        return None if x is None else round(x, 4)

    return {
        "method": "loglikelihood",
        "rows": rows,
        "scored": len(acc),
        "correct": int(acc.sum()),
        "incorrect": int(len(acc) - acc.sum()),
        "errors": errors,
        "accuracy": rounded(float(acc.mean())) if len(acc) else None,
        "acc": rounded(float(acc.mean())) if len(acc) else None,
        "acc_stderr": rounded(bootstrap_stderr(acc, iters)),
        "acc_norm": rounded(float(acc_norm.mean())) if len(acc_norm) else None,
        "acc_norm_stderr": rounded(bootstrap_stderr(acc_norm, iters)),
        "bootstrap_iters": iters,
    }
