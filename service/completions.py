"""OpenAI ``/v1/completions`` and ``/v1/chat/completions`` bodies: what a request asks of the
engine, and the answer in the shape the ``openai`` client and lm-evaluation-harness read.

A completions ``prompt`` is a string, a list of strings, a list of token ids or a list of such
lists (bodies are read with ``jobs.openai_protocol``'s models); each prompt gets ``n`` choices,
numbered prompt by prompt. ``echo`` puts the prompt in front of the text and, with ``logprobs``,
the prompt tokens' logprobs in front of the generated ones (the first token has none). ``max_tokens: 0`` with ``echo`` scores the prompt and
generates nothing (the engine samples one token, which is dropped). Every value is checked
where the engine checks it (``SamplingParams``: n, stop strings, logprobs bounds), so an HTTP
request is held to the same limits as a batch line.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from engine import RequestOutput, SamplingParams
from engine.chat import chat_token_ids
from jobs.openai_protocol import ChatCompletionRequest, CompletionRequest, ProtocolError, SamplingFields
from jobs.openai_responses import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    Usage,
)
from pipeline.openai_output import logprobs_content
from service.errors import APIError, bad_request
from service.structured_replies import ToolReply, chat_constraint, format_constraint

log = logging.getLogger(__name__)

MAX_PROMPTS = 2048  # prompts in one request, as OpenAI's
MAX_NAMED_UNKNOWN = 20  # unknown field names one warning lists (each cut to 64 characters)


@dataclass
class EngineAsk:
    """The engine's prompts and settings for one HTTP request, and how to answer it."""

    prompts: list[list[int]]
    params: list[SamplingParams]
    n: int
    echo: bool = False
    logprobs: int | None = None  # completions: top alternatives per token; chat: top_logprobs
    keep_output: bool = True  # False for max_tokens 0: the sampled token is not part of the answer
    prompt_texts: list[str] | None = None
    stream: bool = False  # answered as server-sent events (service.streaming)
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    tools: ToolReply | None = None  # chat with a forced tool call: the reply becomes tool_calls
    constraint: str | None = None  # the field that asked for structured output, named in its errors


def _supported(request: SamplingFields) -> None:
    """Unknown fields are ignored with one warning naming them (never their values), as
    ``vllm serve`` does, so a client's newer harmless fields pass; a declared field this server
    cannot honour (a penalty, ``logit_bias``) is refused. The route parsed the body with its
    protocol model, ``jobs.openai_protocol``, which keeps unknown fields in ``model_extra``."""
    unknown = sorted(request.model_extra or {})
    if unknown:
        names = ", ".join(repr(name[:64]) for name in unknown[:MAX_NAMED_UNKNOWN])
        more = f" and {len(unknown) - MAX_NAMED_UNKNOWN} more" if len(unknown) > MAX_NAMED_UNKNOWN else ""
        log.warning("request body fields ignored: %s%s", names, more)
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(request, name):
            raise bad_request(f"{name} is not supported by this server (only 0)", name, "unsupported_value")
    if request.logit_bias:
        raise bad_request("logit_bias is not supported by this server", "logit_bias", "unsupported_value")
    if request.stream_options is not None and not request.stream:
        raise bad_request("stream_options can only be given with stream: true", "stream_options", "invalid_value")


def _not_streamed(stream: bool, values: dict[str, Any]) -> None:
    """Completions' logprobs and echo are not streamed here (a 400 names them)."""
    for name, value in values.items():
        if stream and value not in (None, False):
            raise bad_request(f"{name} is not available with stream: true on this server", name, "unsupported_value")


def refused_prompt(reason: str, ask: EngineAsk) -> APIError:
    """The 400 for a prompt the engine refused, naming the field at fault: a constraint that
    does not compile (or too slowly) is the fault of the field that asked for it."""
    if "structured_output" in reason and ask.constraint is not None:
        return bad_request(f"{ask.constraint}: {reason}", ask.constraint, "invalid_value")
    return bad_request(reason, "prompt", "invalid_prompt")


def _constraint(request: SamplingFields, tools: bool = False) -> str | None:
    """Which field asked for structured output (``structured_outputs`` cannot be combined)."""
    if request.structured_outputs is not None:
        return "structured_outputs"
    if tools:
        return "tools"
    return "response_format" if getattr(request, "response_format", None) is not None else None


def check_model(model: str | None, served: str) -> None:
    if model is not None and model != served:
        raise APIError(404, f"The model '{model}' does not exist; this server serves '{served}'.", param="model",
                       code="model_not_found")


def _at_least(value: int | None, name: str, low: int) -> int | None:
    if value is not None and value < low:
        raise bad_request(f"{name} must be an integer >= {low}, got {value!r}", name, "invalid_value")
    return value


def _sampling(request: SamplingFields, max_tokens: int, constraint: str | None = None, **extra: Any
              ) -> SamplingParams:
    values: dict[str, Any] = {"max_tokens": max_tokens, "n": _at_least(request.n, "n", 1) or 1, **extra}
    for name in ("temperature", "top_p", "top_k", "seed"):
        if getattr(request, name) is not None:
            values[name] = getattr(request, name)
    if request.stop is not None:
        values["stop"] = request.stops
    for name in ("ignore_eos", "stop_token_ids"):
        if getattr(request, name) is not None:
            values[name] = getattr(request, name)
    try:
        values.update(request.beam_values())
    except ValueError as exc:
        raise bad_request(str(exc), "use_beam_search", "invalid_value") from None
    if "beam_width" in values and request.stream:
        raise bad_request("use_beam_search: a beam search answers once, not as a stream", "stream", "invalid_value")
    if request.structured_outputs is not None:
        if "structured_output" in values:
            raise bad_request("structured_outputs cannot be combined with response_format or a forced tool_choice",
                              "structured_outputs", "invalid_value")
        values["structured_output"] = request.structured_outputs
    try:
        return SamplingParams(**values)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        param = next((k for k in values if message.startswith(k)), None) or next(
            (k for k in values if re.search(rf"\b{k}\b", message)), None)
        if (param == "structured_output" or "structured_output" in message) and constraint is not None:
            param, message = constraint, f"{constraint}: {message}"
        raise bad_request(message, param, "invalid_value") from None


def _prompts(prompt: Any, tokenizer: Any) -> tuple[list[list[int]], list[str]]:
    """Token ids and texts of a completions ``prompt`` in any of its four forms."""
    def is_ids(value: Any) -> bool:
        return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool)
                                                               for t in value)

    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif is_ids(prompt):
        items = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or is_ids(p) for p in prompt):
        items = prompt
    else:
        raise bad_request("prompt must be a string, a list of strings, a list of token ids or a list of token-id "
                          "lists (none empty)", "prompt", "invalid_value")
    if len(items) > MAX_PROMPTS:
        raise bad_request(f"at most {MAX_PROMPTS} prompts per request, got {len(items)}", "prompt", "invalid_value")
    ids, texts = [], []
    for item in items:
        if isinstance(item, str):
            if not item:
                raise bad_request("prompt strings must not be empty", "prompt", "invalid_value")
            ids.append(tokenizer(item)["input_ids"])  # with the tokenizer's special tokens, as completions do
            texts.append(item)
        else:
            ids.append(list(item))
            texts.append(tokenizer.decode(item))
    return ids, texts


def completion_ask(request: CompletionRequest, tokenizer: Any) -> EngineAsk:
    _supported(request)
    if request.suffix:
        raise bad_request("suffix is not supported by this server", "suffix", "unsupported_value")
    n = _at_least(request.n, "n", 1) or 1
    if (_at_least(request.best_of, "best_of", 1) or n) != n and not request.use_beam_search:  # else: beams
        raise bad_request("best_of must equal n on this server", "best_of", "unsupported_value")
    echo = request.echo
    max_tokens = _at_least(request.max_tokens, "max_tokens", 0)
    max_tokens = 16 if max_tokens is None else max_tokens
    logprobs = _at_least(request.logprobs, "logprobs", 0)
    if max_tokens == 0 and not echo:
        raise bad_request("max_tokens 0 needs echo: true (there is nothing else to return)", "max_tokens",
                          "invalid_value")
    extra: dict[str, Any] = {}
    if logprobs is not None:
        extra["logprobs"] = logprobs
        if echo:
            extra["prompt_logprobs"] = logprobs
    if (structured := format_constraint(request.response_format)) is not None:
        extra["structured_output"] = structured
    stream = bool(request.stream)
    _not_streamed(stream, {"echo": echo, "logprobs": logprobs})
    params = _sampling(request, max(1, max_tokens), _constraint(request), **extra)
    ids, texts = _prompts(request.prompt, tokenizer)
    usage = bool(request.stream_options and request.stream_options.include_usage)
    return EngineAsk(ids, [params] * len(ids), n, echo, logprobs, max_tokens > 0, texts, stream, usage,
                     constraint=_constraint(request))


def chat_ask(request: ChatCompletionRequest, tokenizer: Any, default_max_tokens: int) -> EngineAsk:
    _supported(request)
    try:
        turns = [m.turn(f"messages[{i}]") for i, m in enumerate(request.messages)]
    except ProtocolError as exc:
        raise bad_request(str(exc), exc.param, "invalid_value") from None
    max_tokens = (_at_least(request.max_completion_tokens, "max_completion_tokens", 1)
                  or _at_least(request.max_tokens, "max_tokens", 1) or default_max_tokens)
    top, wants = request.top_logprobs, bool(request.logprobs)
    extra: dict[str, Any] = {"logprobs": top or 0} if wants else {}
    stream = bool(request.stream)
    structured, tools = chat_constraint(request)
    if structured is not None:
        extra["structured_output"] = structured
    constraint = _constraint(request, tools is not None)
    params = _sampling(request, max_tokens, constraint, **extra)
    try:
        ids = chat_token_ids(tokenizer, turns)
    except Exception as exc:  # a template that refuses the conversation (e.g. roles out of order)
        raise bad_request(f"messages: the model's chat template cannot render them: {exc}", "messages",
                          "invalid_value") from None
    usage = bool(request.stream_options and request.stream_options.include_usage)
    return EngineAsk([ids], [params], params.n, logprobs=(top or 0) if wants else None, stream=stream,
                     include_usage=usage, tools=tools, constraint=constraint)


def _legacy_logprobs(out: RequestOutput, sample: int, ask: EngineAsk, prompt_text: str, tokenizer: Any
                     ) -> CompletionLogprobs:
    """``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset`` over the echoed prompt
    (if any) and the generated tokens; offsets count characters from the start of ``text``."""
    top_n = ask.logprobs or 0
    tokens, values, tops, offsets = [], [], [], []
    position = 0

    def add(token_id: int, entry: dict | None, text: str) -> None:
        nonlocal position
        tokens.append(text)
        offsets.append(position)
        position += len(text)
        if entry is None:
            values.append(None)
            tops.append(None)
            return
        values.append(entry[token_id].logprob)
        best = sorted(entry.items(), key=lambda kv: kv[1].rank or 0)
        tops.append({(lp.decoded_token or ""): lp.logprob for tid, lp in best
                     if tid == token_id or (lp.rank or 0) <= top_n})

    if ask.echo:
        entries = out.prompt_logprobs or [None] * len(out.prompt_token_ids)
        for i, token_id in enumerate(out.prompt_token_ids):
            entry = entries[i]
            text = entry[token_id].decoded_token if entry is not None else None
            add(token_id, entry, text if text is not None else tokenizer.decode([token_id]))
        position = len(prompt_text)  # the generated text follows the prompt as echoed
    completion = out.outputs[sample]
    if ask.keep_output:
        for token_id, entry in zip(completion.token_ids, completion.logprobs or [], strict=False):
            add(token_id, entry, entry[token_id].decoded_token or "")
    return CompletionLogprobs(tokens=tokens, token_logprobs=values, top_logprobs=tops, text_offset=offsets)


def completion_body(ask: EngineAsk, outs: list[RequestOutput], model: str, tokenizer: Any) -> Completion:
    choices, prompt_tokens, generated = [], 0, 0
    for p, out in enumerate(outs):
        prompt_tokens += len(out.prompt_token_ids)
        for s, completion in enumerate(out.outputs):
            text = completion.text if ask.keep_output else ""
            generated += len(completion.token_ids) if ask.keep_output else 0
            prompt_text = ask.prompt_texts[p] if ask.prompt_texts else ""
            choices.append(CompletionChoice(
                index=p * ask.n + s, text=prompt_text + text if ask.echo else text,
                logprobs=None if ask.logprobs is None else _legacy_logprobs(out, s, ask, prompt_text, tokenizer),
                finish_reason=(completion.finish_reason or "stop") if ask.keep_output else "length"))
    return Completion(id=f"cmpl-{uuid.uuid4().hex[:24]}", created=int(time.time()), model=model, choices=choices,
                      usage=Usage.of(prompt_tokens, generated))


def chat_body(ask: EngineAsk, out: RequestOutput, model: str, tokenizer: Any) -> ChatCompletion:
    choices, generated = [], 0
    for completion in out.outputs:
        generated += len(completion.token_ids)
        logprobs = None
        if ask.logprobs is not None:
            logprobs = {"content": logprobs_content(completion.token_ids, completion.logprobs or [], ask.logprobs,
                                                    tokenizer), "refusal": None}
        message, finish = AssistantMessage(content=completion.text), completion.finish_reason or "stop"
        if ask.tools is not None:
            message, finish = ask.tools.message(completion.text, finish)
        choices.append(ChatChoice(index=completion.index, message=message, logprobs=logprobs, finish_reason=finish))
    return ChatCompletion(id=f"chatcmpl-{uuid.uuid4().hex[:24]}", created=int(time.time()), model=model,
                          choices=choices, usage=Usage.of(len(out.prompt_token_ids), generated))
