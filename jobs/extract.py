"""Structured extraction: a JSON schema's top-level properties as typed output columns.

The engine constrains decoding to the schema (``StructuredOutput(json=schema)``), so an
output can only fail to validate when it was cut short (``max_tokens``) or the grammar
could not express a keyword; such a row is an error row with the reason. Column types:
string, integer -> int64, number -> double, boolean -> bool; anything else (objects,
arrays, unions) is written as JSON text.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pyarrow as pa
import pyarrow.compute as pc

from jobs.openai_merge import merge_if_requested
from pipeline.kind_stages import RowRejected

_SCALARS = {"string": "string", "integer": "int64", "number": "float64", "boolean": "bool"}


def property_type(prop: Any) -> str:
    """The column type of one property: a scalar type (optionally nullable), else JSON text."""
    kind = prop.get("type") if isinstance(prop, dict) else None
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if kind in _SCALARS and not (isinstance(prop, dict) and "enum" in prop and kind != "string"):
        return _SCALARS[kind]
    if isinstance(prop, dict) and "enum" in prop and all(isinstance(v, str) for v in prop["enum"]):
        return "string"
    return "json"


def schema_columns(schema: dict[str, Any]) -> dict[str, str]:
    """{property: column type}, in the schema's order."""
    return {name: property_type(prop) for name, prop in schema["properties"].items()}


def _column_value(value: Any, kind: str) -> Any:
    if value is None:
        return None
    if kind == "json":
        return json.dumps(value, ensure_ascii=False)
    if kind == "float64" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def extract_row(row: dict[str, Any], record_fields: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """Row stage: parse and validate the output; one value per property column."""
    if row.get("error"):
        return {}
    text = row.get("output") or ""
    cut = " (cut at max_tokens)" if row.get("finish_reason") == "length" else ""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RowRejected(f"output is not valid JSON{cut}: {exc.msg}: character {exc.pos}") from None
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(options["schema"]).iter_errors(value))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "the top level"
        raise RowRejected(f"output does not match the schema{cut}: {error.message} (at {where})")
    return {name: _column_value(value.get(name), kind) for name, kind in options["columns"].items()}


def summarize_extract(table: pa.Table, options: dict[str, Any]) -> dict[str, Any]:
    """Summary stage: how many rows gave valid output."""
    rows = table.num_rows
    valid = len(table.filter(pc.is_null(table.column("error")))) if rows else 0
    summary: dict[str, Any] = {"rows": rows, "valid": valid, "errors": rows - valid,
                               "valid_fraction": round(valid / rows, 4) if rows else None}
    merged = merge_if_requested(options)
    if merged:
        summary["openai_output"] = merged
    return summary
