"""The OpenAI requests tokenmill answers, as pydantic models: one definition each, read by the live
routes (``service/``) and by the batch-line check (``jobs/openai_requests.py``).

The models check shapes and types (strictly: ``"5"`` is not an integer); the limits on values
(``n``, stop strings, logprobs, temperature...) stay where the engine checks them,
``SamplingParams``, so a batch line, a live request and a job spec meet the same limits.
Unknown fields are kept (``model_extra``), not dropped, and ignored with a warning naming
them, by the live routes as by ``vllm serve`` and by a batch line. Fields a client may send that change nothing
here (``user``, ``metadata``, ``store``, ``service_tier``, ``tools: []``...) are declared, so
they pass everywhere.

``BODIES`` is the one place that says which body model a url takes.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_TOP_LOGPROBS = 20  # OpenAI's limit


class OpenModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", populate_by_name=True)


class StreamOptions(OpenModel):
    include_usage: bool = False


class JsonSchemaFormat(OpenModel):
    name: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(OpenModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class FunctionSpec(OpenModel):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(OpenModel):
    type: Literal["function"]
    function: FunctionSpec


class FunctionName(OpenModel):
    name: str


class NamedToolChoice(OpenModel):
    type: Literal["function"]
    function: FunctionName


class ContentPart(OpenModel):
    type: str
    text: str | None = None


class ChatMessage(OpenModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self, where: str) -> str:
        """The message's text: text parts joined by newlines; ``where`` names it in an error."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise ProtocolError(where, f"{where}: only text content parts are supported")
        return "\n".join(part.text or "" for part in self.content)

    def turn(self, where: str) -> dict[str, str]:
        """``{role, content}`` for a chat template (``developer`` is a system turn)."""
        return {"role": "system" if self.role == "developer" else self.role, "content": self.text(where)}


BEAM_KEYS = ("use_beam_search", "best_of", "length_penalty", "early_stopping")  # as vLLM's server takes them


class SamplingFields(OpenModel):
    """What completions and chat requests share."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    # vLLM's extensions, as ``vllm serve`` takes them (the openai client's ``extra_body``)
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    structured_outputs: dict[str, Any] | None = None  # {json | regex | choice | grammar | json_object}
    use_beam_search: bool | None = None  # beam search: ``best_of`` beams (default ``n``), the ``n`` best back
    best_of: int | None = None
    length_penalty: float | None = None
    early_stopping: bool | Literal["never"] | None = None

    @property
    def stops(self) -> list[str] | None:
        return [self.stop] if isinstance(self.stop, str) else self.stop

    def beam_values(self, prefix: str = "") -> dict[str, Any]:
        """vLLM's beam-search keys as ``SamplingParams`` values: ``use_beam_search`` searches with
        ``best_of`` beams (default ``n``) and returns the ``n`` best; ``length_penalty`` and
        ``early_stopping`` as in HF. A beam key without ``use_beam_search`` is a ValueError."""
        if not self.use_beam_search:
            given = [k for k in BEAM_KEYS[1:] if getattr(self, k) is not None]
            if given:
                raise ValueError(f"{prefix}{given[0]} needs {prefix}use_beam_search = true")
            return {}
        values: dict[str, Any] = {"beam_width": self.best_of if self.best_of is not None else self.n or 1}
        for key in BEAM_KEYS[2:]:
            if getattr(self, key) is not None:
                values[key] = getattr(self, key)
        return values


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None
    response_format: ResponseFormat | None = None  # vLLM's extension: constrained as on chat


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    max_completion_tokens: int | None = None
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None


class BatchRequestLine(OpenModel):
    """One line of a Batch API input file; ``body`` is read with ``BODIES[url]``."""

    custom_id: str = Field(min_length=1)
    method: str
    url: str
    body: dict[str, Any]


BODIES: dict[str, type[SamplingFields]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
}
ALIASES = {"/chat/completions": "/v1/chat/completions", "/completions": "/v1/completions"}

# What a field of several shapes must be, said once (pydantic names every shape it tried).
_SHAPES = {
    "prompt": "must be a string, a list of strings, a list of token ids or a list of token-id lists",
    "stop": "must be a string or a list of strings",
    "tool_choice": 'must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
    "content": "must be a string or a list of {type, text} parts",
}


class RequestLine(NamedTuple):
    """One batch request line as the converted file's row (``jobs.openai_requests.parse_request``)."""

    custom_id: str
    row: dict[str, Any]  # the converted file's row (JSON: it is written as a line)
    sampling: dict[str, Any]  # the line's own sampling settings (none for an embeddings line)
    ignored: set[str]  # body keys the batch does not use (a warning names them)


class ProtocolError(ValueError):
    """A request that does not fit its model: ``param`` names the field (dotted, with the caller's
    prefix), the message says what is wrong in one line."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _is_shape_tag(part: Any) -> bool:
    """Union branches in a pydantic location: ``str``, ``list[int]``, ``NamedToolChoice``..."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool", "dict", "list")
                                      or "[" in part or part[:1].isupper() or "-" in part)


def describe(error: dict[str, Any], prefix: str = "") -> ProtocolError:
    """One pydantic error (``ValidationError.errors()[0]``) as a one-line ``ProtocolError``."""
    loc = list(error["loc"])
    cut = next((i for i, part in enumerate(loc) if _is_shape_tag(part)), None)
    path = loc if cut is None else loc[:cut]
    param = prefix + ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in path).replace(".[", "[")
    last = next((p for p in reversed(path) if isinstance(p, str)), "")
    if error["type"] == "missing":
        return ProtocolError(param, f"Missing required parameter: '{param}'.")
    if cut is not None and last in _SHAPES:
        return ProtocolError(param, f"{param} {_SHAPES[last]}")
    return ProtocolError(param or prefix.rstrip("."), f"{param or 'the request'}: {error['msg']}")


def parse(model: type[OpenModel], data: Any, prefix: str = "") -> Any:
    """``data`` as ``model``, or a ``ProtocolError`` for its first fault."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise describe(exc.errors()[0], prefix) from None
