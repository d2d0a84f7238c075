"""Metrics over several samples of one prompt: pass@k and majority vote.

pass@k uses the unbiased estimator of Chen et al. (2021, "Evaluating Large Language Models
Trained on Code"): with n samples of which c are correct, the probability that at least one
of k samples drawn without replacement is correct, 1 - C(n-c, k) / C(n, k), computed as a
product so large n does not overflow.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from jobs.answer_text import normalize_answer


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with ``n`` samples, ``c`` of them correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def majority(predictions: Sequence[str | None]) -> str | None:
    """The most frequent prediction (ties: the one seen first); None when no sample gave one."""
    counts = Counter(p for p in predictions if p is not None)
    if not counts:
        return None
    top = max(counts.values())
    return next(p for p in predictions if p is not None and counts[p] == top)


GENERATE_SAMPLE_COLUMNS = {"samples": "list<string>", "sample_finish_reasons": "list<string>", "majority": "string"}


def majority_row(row: dict[str, Any], record_fields: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """Row stage of ``generate`` with n samples: the majority answer (first sample whose
    normalised text is the most frequent; normalised as the ``exact`` scoring method does)."""
    samples = row.get("samples")
    if row.get("error") or not samples:
        return {}
    keys = [normalize_answer(s or "") for s in samples]
    vote = majority(keys)
    return {"majority": None if vote is None else samples[keys.index(vote)]}
