"""A job's ``progress`` block of its status: counted from its shards' rows, one way for the
live state (Redis, the service's embedded runner) and for a job read from its output."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pipeline.shard_outcome import ShardState


def job_progress(
    rows: list[dict[str, Any]], states: Iterable[ShardState], elapsed_s: float, *,
    token_columns: tuple[str, ...] = ("output_tokens",), elapsed_digits: int | None = None,
) -> dict[str, Any]:
    """Shards per state (those of ``states``), summed rows, errors and ``token_columns``, and the
    output token rate over ``elapsed_s`` (shown rounded to ``elapsed_digits`` when given)."""
    count = {state.value: sum(r["state"] == state for r in rows) for state in states}
    output_tokens = sum(r["output_tokens"] for r in rows)
    return {
        "shards_total": len(rows),
        **{f"shards_{k}": v for k, v in count.items()},
        "rows_done": sum(r["rows_done"] for r in rows),
        "errors": sum(r["errors"] for r in rows),
        **{name: sum(r[name] for r in rows) for name in token_columns},
        "tokens_per_s": round(output_tokens / elapsed_s, 2) if elapsed_s > 0 else 0.0,
        "elapsed_s": elapsed_s if elapsed_digits is None else round(elapsed_s, elapsed_digits),
    }
