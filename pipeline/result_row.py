"""A finished row as one typed record, from the request builder to the part (issue 40).

``RequestResult`` is what a row's requests produced (or what it takes from an earlier part or
an identical row); ``ResultRow`` is the output row made of it: the fixed columns, the passed-
through fields, the request mode's and the kind's columns, and the row's OpenAI batch line.
The row becomes a dict only for a kind's row step (``columns``) and Arrow only in
``pipeline.output_schema``; its names are ``pipeline.output_columns.FIXED_COLUMNS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The fields of a RequestResult that are fixed columns; any other value is a column of its own.
_RESULT_FIELDS = ("output", "finish_reason", "prompt_tokens", "output_tokens", "cached_prompt_tokens", "error",
                  "latency_s")


@dataclass(frozen=True, slots=True)
class OpenAIChoice:
    """One sample of a row as its OpenAI line shows it (``n`` samples, token logprobs)."""

    index: int
    text: str | None
    finish_reason: str | None
    logprobs: list[dict[str, Any]] | None = None  # OpenAI's ``logprobs.content``

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "text": self.text, "finish_reason": self.finish_reason,
                "logprobs": self.logprobs}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OpenAIChoice:
        return cls(data["index"], data["text"], data["finish_reason"], data["logprobs"])


@dataclass(frozen=True, slots=True)
class RequestResult:
    """A row's computed values: the fixed columns its requests fill, the mode's ``columns``
    (samples, scores, a vector), and its samples for the OpenAI line. ``latency_s`` is set
    only on a result taken from an earlier part (it keeps that row's)."""

    output: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_prompt_tokens: int = 0
    error: str | None = None
    latency_s: float | None = 0.0
    columns: Mapping[str, Any] = field(default_factory=dict)  # never changed: a new row gets new ones
    choices: tuple[OpenAIChoice, ...] | None = None

    @classmethod
    def from_values(cls, values: Mapping[str, Any], choices: tuple[OpenAIChoice, ...] | None = None,
                    ) -> RequestResult:
        """From column values by name (a request mode's, a previous part's row): the fixed
        columns to their fields, the rest to ``columns`` in their order."""
        fixed = {k: v for k, v in values.items() if k in _RESULT_FIELDS}
        columns = {k: v for k, v in values.items() if k not in _RESULT_FIELDS}
        return cls(**fixed, columns=columns, choices=choices)


@dataclass(frozen=True, slots=True)
class ResultRow:
    """One output row. ``columns``: the request mode's values and the kind's extra columns (an
    extra column the row has no value for is null; a value without a column is not written);
    ``openai_line``: the row's batch output line, when the plan writes them."""

    id: str
    passthrough: Mapping[str, str | None]
    output: str | None
    finish_reason: str | None
    prompt_tokens: int
    output_tokens: int
    cached_prompt_tokens: int
    error: str | None
    latency_s: float | None
    content_key: str | None
    columns: Mapping[str, Any] = field(default_factory=dict)  # never changed: a new row gets new ones
    choices: tuple[OpenAIChoice, ...] | None = None
    openai_line: dict[str, Any] | None = field(default=None, compare=False)

    def values(self) -> dict[str, Any]:
        """The row by column name, in schema order, then the columns outside the schema: what a
        kind's row step reads, and what ``pipeline.output_schema`` writes."""
        return {
            "id": self.id, **self.passthrough, "output": self.output, "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens, "error": self.error, "latency_s": self.latency_s,
            "content_key": self.content_key, **self.columns,
        }
