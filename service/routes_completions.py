"""``POST /v1/completions`` and ``POST /v1/chat/completions``: answered synchronously by the
server's live engine (``service.live_engine``), behind the same key and body limits as every
``/v1/`` route (``service.guard``). With ``stream: true`` the answer is server-sent events
(``service.streaming``)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request

from engine import RequestError
from jobs.openai_protocol import ChatCompletionRequest, CompletionRequest
from jobs.openai_responses import ChatCompletion, Completion
from service.auth import Owner
from service.completions import (
    EngineAsk,
    chat_ask,
    chat_body,
    check_model,
    completion_ask,
    completion_body,
    refused_prompt,
)
from service.errors import APIError, bad_request
from service.live_engine import LiveEngine
from service.streaming import EventStream, events, open_call

router = APIRouter(prefix="/v1")


async def _run(request: Request, owner: str, prompts: list[list[int]], params: list,
               ask: EngineAsk | None = None) -> list:
    """The call's outputs; a refused prompt is a 400 naming the field at fault (``input`` for
    embeddings, which pass no ``ask``)."""
    live: LiveEngine = request.app.state.live_engine
    held = live.share.admit(owner, prompts, params)  # 400 over a request's bound, 429 over the key's share
    future = live.submit(prompts, params, owner=owner)
    try:
        return await asyncio.wrap_future(future)
    except RequestError as exc:
        raise (refused_prompt(exc.reason, ask) if ask else bad_request(exc.reason, "input", "invalid_input")) from None
    except asyncio.CancelledError:  # the client disconnected
        live.cancel(future)
        raise
    except Exception as exc:
        raise APIError(500, f"the engine failed: {type(exc).__name__}: {exc}", code="engine_error") from None
    finally:
        live.share.release(owner, held)


def _tokenizer(request: Request) -> Any:
    return request.app.state.live_engine.tokenizer


async def _stream(request: Request, owner: str, ask: EngineAsk, chat: bool, tokenizer: Any) -> EventStream:
    """The call's events; it holds its key's share until the stream ends, however it ends."""
    live: LiveEngine = request.app.state.live_engine
    held = live.share.admit(owner, ask.prompts, ask.params)
    try:
        future, queue = await open_call(live, ask, owner)
    except BaseException:
        live.share.release(owner, held)
        raise
    lines = events(live, ask, future, queue, chat=chat, model=request.app.state.settings.model_name,
                   tokenizer=tokenizer, include_usage=ask.include_usage)
    return EventStream(lines, live, future, on_end=lambda: live.share.release(owner, held))


@router.post("/completions", response_model=Completion)
async def completions(request: Request, owner: Owner, body: Annotated[CompletionRequest, Body()]) -> Any:
    settings = request.app.state.settings
    check_model(body.model, settings.model_name)
    tokenizer = await asyncio.to_thread(_tokenizer, request)
    ask = await asyncio.to_thread(completion_ask, body, tokenizer)
    if ask.stream:
        return await _stream(request, owner, ask, False, tokenizer)
    outs = await _run(request, owner, ask.prompts, ask.params, ask)
    return await asyncio.to_thread(completion_body, ask, outs, settings.model_name, tokenizer)


@router.post("/chat/completions", response_model=ChatCompletion)
async def chat_completions(request: Request, owner: Owner, body: Annotated[ChatCompletionRequest, Body()]) -> Any:
    settings = request.app.state.settings
    check_model(body.model, settings.model_name)
    tokenizer = await asyncio.to_thread(_tokenizer, request)
    ask = await asyncio.to_thread(chat_ask, body, tokenizer, settings.default_max_tokens)
    if ask.stream:
        return await _stream(request, owner, ask, True, tokenizer)
    (out,) = await _run(request, owner, ask.prompts, ask.params, ask)
    return chat_body(ask, out, settings.model_name, tokenizer)
