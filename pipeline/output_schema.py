"""The Arrow schema of output rows (every part of a job has it), and result rows as a table:
the one place both are made (``pipeline.result_row.ResultRow`` knows no Arrow).

Passthrough fields are written as strings (JSON text for lists/objects, null for a
missing value): CSV gives only strings while JSONL may give a different type per row,
and every part of a job must share one schema so readers can concatenate them.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pyarrow as pa

from pipeline.output_columns import FIXED_COLUMNS
from pipeline.plan import JobPlan
from pipeline.result_row import ResultRow

_EXTRA_TYPES = {
    "string": pa.string(),
    "str": pa.string(),
    "float64": pa.float64(),
    "double": pa.float64(),
    "float": pa.float64(),
    "int64": pa.int64(),
    "int": pa.int64(),
    "bool": pa.bool_(),
    "boolean": pa.bool_(),
}
# Per-row lists: samples of one prompt, scores of each answer choice.
_EXTRA_TYPES.update({f"list<{name}>": pa.list_(t) for name, t in list(_EXTRA_TYPES.items())})
# Vectors of one length (embeddings): "fixed_size_list<float32>[1024]".
_VECTOR = re.compile(r"fixed_size_list<float32>\[([1-9][0-9]{0,5})\]")


class SchemaError(ValueError):
    """The plan's columns clash or name an unsupported type."""


def extra_type(name: str, type_name: str) -> pa.DataType:
    t = _EXTRA_TYPES.get(str(type_name).lower())
    if t is None and (vector := _VECTOR.fullmatch(str(type_name).lower())):
        t = pa.list_(pa.float32(), int(vector.group(1)))
    if t is None:
        raise SchemaError(f"extra column {name!r}: unsupported type {type_name!r} "
                          f"(use one of {sorted(_EXTRA_TYPES)} or fixed_size_list<float32>[N])")
    return t


def output_schema(plan: JobPlan) -> pa.Schema:
    """id, passthrough fields, the fixed result columns, then the kind's extra columns."""
    fields = [pa.field("id", pa.string())]
    seen = {"id"}
    for name in plan.passthrough_fields:
        if name in FIXED_COLUMNS or name in seen:
            raise SchemaError(f"passthrough field {name!r} clashes with an output column")
        seen.add(name)
        fields.append(pa.field(name, pa.string()))
    for name, type_name in FIXED_COLUMNS.items():
        if name != "id":
            fields.append(pa.field(name, _EXTRA_TYPES[type_name]))
            seen.add(name)
    for name, type_name in plan.extra_columns.items():
        if name in seen:
            raise SchemaError(f"extra column {name!r} clashes with another output column")
        seen.add(name)
        fields.append(pa.field(name, extra_type(name, type_name)))
    return pa.schema(fields)


def passthrough_value(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


def coerce_extra(value: Any, t: pa.DataType) -> Any:
    """A row step's value as the column's Python type; raises ValueError/TypeError if it is not one."""
    if value is None:
        return None
    if pa.types.is_list(t):
        if not isinstance(value, list | tuple):
            raise TypeError(f"expected a list, got {type(value).__name__}")
        return [coerce_extra(v, t.value_type) for v in value]
    if t == pa.string():
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    if t == pa.bool_():
        if not isinstance(value, bool):
            raise TypeError(f"expected a bool, got {type(value).__name__}")
        return value
    if t == pa.int64():
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"expected an integer, got {type(value).__name__}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def rows_to_table(rows: list[ResultRow], schema: pa.Schema) -> pa.Table:
    """The rows as a table of ``schema``: a value whose name has no column is not written."""
    return pa.Table.from_pylist([row.values() for row in rows], schema=schema)
