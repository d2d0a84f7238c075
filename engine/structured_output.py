"""Structured output: what a request constrains its text to, in the shape of vLLM's
``StructuredOutputsParams``. The grammar machinery (xgrammar) lives in ``engine.grammar``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass
class StructuredOutput:
    """Exactly one of: ``json`` (a JSON schema, as a dict or a JSON string), ``regex``,
    ``choice`` (a list of strings, the output is one of them), ``grammar`` (EBNF text in
    xgrammar's GBNF dialect) or ``json_object=True`` (any JSON object, OpenAI's json_object mode)."""

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool = False

    def __post_init__(self) -> None:
        if self.choice is not None and not isinstance(self.choice, str):
            self.choice = list(self.choice)
        self.validate()

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    def validate(self) -> None:
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(
                f"structured_output needs exactly one of json, regex, choice, grammar, json_object; got "
                f"{', '.join(given) if given else 'none'}"
            )
        if self.json is not None:
            if isinstance(self.json, str):
                try:
                    json.loads(self.json)
                except ValueError as e:
                    raise ValueError(f"structured_output.json is not valid JSON: {e}") from None
            elif not isinstance(self.json, dict):
                raise ValueError(f"structured_output.json must be a dict or a JSON string, got {self.json!r}")
        if self.regex is not None and (not isinstance(self.regex, str) or not self.regex):
            raise ValueError(f"structured_output.regex must be a non-empty string, got {self.regex!r}")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise ValueError(f"structured_output.grammar must be a non-empty string, got {self.grammar!r}")
        if self.choice is not None and (
            isinstance(self.choice, str) or not self.choice
            or any(not isinstance(c, str) or not c for c in self.choice)
        ):
            raise ValueError(f"structured_output.choice must be a non-empty list of non-empty strings, got {self.choice!r}")
        if not isinstance(self.json_object, bool):
            raise ValueError(f"structured_output.json_object must be a bool, got {self.json_object!r}")

    def key(self) -> tuple[str, str]:
        """A hashable identity of the constraint: equal keys compile to the same grammar."""
        kind = self.kind
        value = getattr(self, kind)
        if kind == "json":
            text = json.dumps(json.loads(value) if isinstance(value, str) else value)  # order matters
        elif kind == "choice":
            text = json.dumps(value)
        else:
            text = str(value)
        return kind, text

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StructuredOutput:
        if not isinstance(data, dict):
            raise ValueError(f"structured_output must be a dict or StructuredOutput, got {data!r}")
        unknown = sorted(set(data) - set(KINDS))
        if unknown:
            raise ValueError(f"unknown structured_output field(s): {', '.join(unknown)}")
        return cls(**data)
