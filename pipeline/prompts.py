"""Rows to chat messages: a shared instruction prefix, then one user turn per row.

Templates are user input, so they are never passed to ``str.format`` (which would let
``{x.__class__}`` or ``{x[0]}`` reach into Python objects): only ``{name}`` placeholders
of plain identifiers are accepted, and the text is assembled by concatenation.
Every row's messages start with the same system + few-shot turns, so the rendered
prompts share a token prefix and the engine's prefix cache serves it once.
"""

from __future__ import annotations

import json
import re
import string
from typing import Any

from pipeline.plan import PromptPlan

_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ROLES = ("system", "user", "assistant")


class TemplateError(ValueError):
    """A prompt template or a row cannot be rendered; the message says which and why."""


def _parse(template: str) -> list[tuple[str, str | None]]:
    """[(literal text, field name or None)], rejecting anything but plain ``{name}``."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise TemplateError(
            f"prompt template: {exc} (write '{{{{' or '}}}}' for a literal brace)"
        ) from None
    out: list[tuple[str, str | None]] = []
    for literal, name, spec, conversion in parts:
        if name is None:
            out.append((literal, None))
            continue
        shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
        if not _PLAIN_NAME.match(name):
            raise TemplateError(f"prompt template: field '{shown}' is not a plain field name")
        if conversion or spec:
            raise TemplateError(
                f"prompt template: field '{shown}' has a conversion or format spec; only '{{{name}}}' is allowed"
            )
        out.append((literal, name))
    return out


def validate_template(template: str) -> list[str]:
    """Check a user template at spec time; returns the field names it uses, in order."""
    if not isinstance(template, str):
        raise TemplateError(f"prompt template must be a string, got {type(template).__name__}")
    return [name for _, name in _parse(template) if name is not None]


def validate_prompt(prompt: PromptPlan) -> None:
    """Everything about a PromptPlan that can be checked without a row."""
    if prompt.prompt_field is None and prompt.messages_field is None:
        validate_template(prompt.user_template)
    for i, turn in enumerate(prompt.few_shot):
        if not isinstance(turn, dict) or turn.get("role") not in _ROLES or not isinstance(turn.get("content"), str):
            raise TemplateError(
                f"prompt few_shot[{i}]: expected {{'role': system|user|assistant, 'content': str}}, got {turn!r}"
            )


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) else str(value)


def render_template(template: str, fields: dict[str, Any], row: int | None = None) -> str:
    """Fill ``{name}`` placeholders from ``fields``; a missing field names the row."""
    pieces: list[str] = []
    for literal, name in _parse(template):
        pieces.append(literal)
        if name is not None:
            if name not in fields:
                where = f"row {row}: " if row is not None else ""
                raise TemplateError(f"{where}template field '{name}' missing")
            pieces.append(_as_text(fields[name]))
    return "".join(pieces)


def _row_messages(value: Any, field: str, row: int | None) -> list[dict[str, str]]:
    """A row's own chat (OpenAI batch input): a message list, or a request body holding one."""
    where = f"row {row}: " if row is not None else ""
    if isinstance(value, dict):
        value = value.get("messages")
    if not isinstance(value, list) or not value:
        raise TemplateError(f"{where}field '{field}' is not a non-empty list of messages")
    messages = []
    for m in value:
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise TemplateError(f"{where}field '{field}' has a message without a system/user/assistant role")
        messages.append({"role": m["role"], "content": _as_text(m.get("content"))})
    return messages


def shared_prefix(prompt: PromptPlan) -> list[dict[str, str]]:
    """The turns every row starts with: system instruction, then few-shot examples."""
    head = [{"role": "system", "content": prompt.system}] if prompt.system else []
    return head + [{"role": t["role"], "content": t["content"]} for t in prompt.few_shot]


def render_messages(prompt: PromptPlan, fields: dict[str, Any], row: int | None = None) -> list[dict[str, str]]:
    """Chat messages for one row: shared prefix + the row's user turn (or the row's own chat)."""
    if prompt.messages_field is not None:
        if prompt.messages_field not in fields:
            where = f"row {row}: " if row is not None else ""
            raise TemplateError(f"{where}messages field '{prompt.messages_field}' missing")
        own = _row_messages(fields[prompt.messages_field], prompt.messages_field, row)
        if own[0]["role"] == "system":  # the row's own system turn wins over the plan's
            return own[:1] + [{"role": t["role"], "content": t["content"]} for t in prompt.few_shot] + own[1:]
        return shared_prefix(prompt) + own
    if prompt.prompt_field is not None:
        if prompt.prompt_field not in fields:
            where = f"row {row}: " if row is not None else ""
            raise TemplateError(f"{where}prompt field '{prompt.prompt_field}' missing")
        user = _as_text(fields[prompt.prompt_field])
    else:
        user = render_template(prompt.user_template, fields, row)
    return shared_prefix(prompt) + [{"role": "user", "content": user}]


def prefix_key(messages: list[dict[str, str]]) -> str:
    """Rows with equal keys share every turn but the last: admit them together."""
    return json.dumps(messages[:-1], ensure_ascii=False, sort_keys=True)
