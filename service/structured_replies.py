"""``response_format`` and ``tools`` on ``/v1/chat/completions``: what the engine's xgrammar
constraint (``engine.structured_output``) is, and the reply's ``tool_calls``.

- ``response_format`` ``json_object`` gives any JSON object, ``json_schema`` the schema's
  (``strict`` or not: the schema is always enforced), as in batches; on ``/v1/completions`` too,
  as ``vllm serve`` takes it.
- ``tools`` with ``tool_choice`` naming a function constrains the reply to that function's
  ``parameters`` schema; the reply is one ``tool_calls`` entry whose ``arguments`` are the text.
- ``tool_choice: "required"`` constrains the reply to ``{"name": one of the tools, "arguments":
  that tool's parameters}`` and returns it as one ``tool_calls`` entry (finish reason
  ``tool_calls``).
- ``tool_choice: "none"`` (or no tools) is plain text. ``"auto"``, which is also the default when
  tools are given, is refused as ``vllm serve`` refuses it without a tool-call parser: this server
  has no parser that finds a call in free text.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, NamedTuple

from jobs.openai_protocol import ChatCompletionRequest, ResponseFormat
from jobs.openai_requests import response_format_output
from jobs.openai_responses import AssistantMessage, FunctionCall, ToolCall
from service.errors import bad_request

ANY_OBJECT: dict[str, Any] = {"type": "object"}


class ToolAnswer(NamedTuple):
    """A reply as the assistant message it becomes, and its finish reason."""

    message: AssistantMessage
    finish_reason: str


class ChatConstraint(NamedTuple):
    """The engine's structured_output for a chat request (None: plain text) and, for a forced
    tool call, how to answer it (None: no tool call)."""

    structured: dict[str, Any] | None
    tools: ToolReply | None


@dataclass
class ToolReply:
    """How a constrained reply becomes ``tool_calls``: ``name`` for a named function, else the
    reply is ``{"name", "arguments"}`` (``tool_choice: "required"``)."""

    name: str | None

    def message(self, text: str, finish_reason: str) -> ToolAnswer:
        """The assistant message and finish reason for a reply's text (a reply cut short by
        ``max_tokens`` stays plain text: it is not a whole call)."""
        if finish_reason == "length":
            return ToolAnswer(AssistantMessage(content=text), finish_reason)
        if self.name is not None:
            return ToolAnswer(_call_message(self.name, text), finish_reason)
        try:
            call = json.loads(text)
            return ToolAnswer(_call_message(call["name"], json.dumps(call["arguments"], ensure_ascii=False)),
                              "tool_calls")
        except (ValueError, KeyError, TypeError):  # only an error output can differ from its grammar
            return ToolAnswer(AssistantMessage(content=text), finish_reason)


def _call_message(name: str, arguments: str) -> AssistantMessage:
    call = ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", function=FunctionCall(name=name, arguments=arguments))
    return AssistantMessage(content=None, tool_calls=[call])


def _required(tools: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"anyOf": [{"type": "object", "properties": {"name": {"const": name}, "arguments": schema},
                       "required": ["name", "arguments"], "additionalProperties": False}
                      for name, schema in tools.items()]}


def format_constraint(response_format: ResponseFormat | None) -> dict[str, Any] | None:
    """The engine's structured_output for a ``response_format`` (None: plain text)."""
    try:
        return response_format_output(response_format) if response_format else None
    except ValueError as exc:
        raise bad_request(str(exc).removeprefix("body."), "response_format", "invalid_value") from None


def chat_constraint(request: ChatCompletionRequest) -> ChatConstraint:
    """The engine's structured_output for a chat request and, for a forced tool call, how to answer it."""
    tools = {t.function.name: t.function.parameters or ANY_OBJECT for t in request.tools or []}
    choice = request.tool_choice or ("auto" if tools else "none")
    structured = format_constraint(request.response_format)
    if choice == "none":
        return ChatConstraint(structured, None)
    if not tools:
        raise bad_request("tool_choice needs tools", "tool_choice", "invalid_value")
    if choice == "auto":
        raise bad_request('tool_choice "auto" is not supported by this server (it has no tool-call parser); '
                          'send "required", a named function or "none"', "tool_choice", "unsupported_value")
    if structured is not None:
        raise bad_request("response_format and a forced tool_choice cannot be combined", "response_format",
                          "invalid_value")
    if choice == "required":
        return ChatConstraint({"json": _required(tools)}, ToolReply(None))
    name = choice.function.name
    if name not in tools:
        raise bad_request(f"tool_choice names {name!r}, which is not among the tools", "tool_choice", "invalid_value")
    return ChatConstraint({"json": tools[name]}, ToolReply(name))
