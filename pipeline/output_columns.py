"""The columns the pipeline writes on every output row, named once.

The output schema, the rows the driver builds and the spec check that keeps passthrough
fields off these names all read this list. No pyarrow here: specs are checked without it.
"""

from __future__ import annotations

from typing import Any

# name -> column type (a pipeline.output_schema type name), in schema order
FIXED_COLUMNS: dict[str, str] = {
    "id": "string",
    "output": "string",
    "finish_reason": "string",
    "prompt_tokens": "int64",
    "output_tokens": "int64",
    "cached_prompt_tokens": "int64",
    "error": "string",  # null when the row is fine
    "latency_s": "float64",
    "content_key": "string",  # what the result depends on (pipeline.row_keys); null for rows with no request
}
RESERVED_COLUMNS = frozenset(FIXED_COLUMNS)

_EMPTY = {"int64": 0, "float64": 0.0}
# The columns a row's requests produce: what a re-run may take from the previous part (issue 28).
COMPUTED_COLUMNS = ("output", "finish_reason", "prompt_tokens", "output_tokens", "cached_prompt_tokens",
                    "latency_s")


def empty_result() -> dict[str, Any]:
    """Every fixed column but ``id`` at its value for a row that produced nothing (counts 0, text null)."""
    return {name: _EMPTY.get(t) for name, t in FIXED_COLUMNS.items() if name != "id"}
