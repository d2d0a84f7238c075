"""The columns the pipeline writes on every output row, named once.

The output schema and the spec check that keeps passthrough fields off these names read
this list; ``pipeline.result_row.ResultRow`` has a field of each name (``RequestResult``'s defaults:
counts 0, text null). No pyarrow here: specs are checked without it.
"""

from __future__ import annotations

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
# The columns a row's requests produce: what a re-run may take from the previous part (issue 28).
COMPUTED_COLUMNS = ("output", "finish_reason", "prompt_tokens", "output_tokens", "cached_prompt_tokens",
                    "latency_s")

