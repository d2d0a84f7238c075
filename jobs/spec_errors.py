"""Spec validation errors as one line each: ``<field path>: <message>``.

Pydantic's own rendering is long and shows input values (which may be credentials);
users need the path of the bad field and what is wrong with it, plus a suggestion
when an unknown key is a near-miss of a real one.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError

_PREFIXES = ("Value error, ", "Assertion failed, ")


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The section model that holds the field at ``loc`` (to suggest names for unknown keys)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return None
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if current is None:
            return None
    return current


def format_errors(exc: ValidationError, model: type[BaseModel] | None = None) -> list[str]:
    """One ``path: message`` line per error (cross-field messages already start with their path)."""
    lines = []
    for error in exc.errors(include_input=False, include_url=False):
        loc = tuple(error["loc"])
        message = error["msg"]
        for prefix in _PREFIXES:
            message = message.removeprefix(prefix)
        if error["type"] == "extra_forbidden":
            message = "unknown field"
            parent = _model_at(model, loc[:-1]) if model is not None else None
            if parent is not None:
                close = difflib.get_close_matches(str(loc[-1]), list(parent.model_fields), n=1)
                if close:
                    message += f"; did you mean '{close[0]}'?"
        elif error["type"] == "missing":
            message = "required field missing"
        lines.append(f"{_path(loc)}: {message}" if loc else message)
    return lines
