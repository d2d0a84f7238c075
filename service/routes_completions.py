"""``POST /v1/completions`` and ``POST /v1/chat/completions``: answered synchronously by the
server's live engine (``service.live_engine``), behind the same key and body limits as every
``/v1/`` route (``service.guard``)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request

from engine import RequestError
from service.auth import Owner
from service.completions import chat_ask, chat_body, check_model, completion_ask, completion_body
from service.errors import APIError, bad_request
from service.live_engine import LiveEngine

router = APIRouter(prefix="/v1")


async def _run(request: Request, owner: str, prompts: list[list[int]], params: list) -> list:
    live: LiveEngine = request.app.state.live_engine
    held = live.share.admit(owner, prompts, params)  # 400 over a request's bound, 429 over the key's share
    future = live.submit(prompts, params, owner)
    try:
        return await asyncio.wrap_future(future)
    except RequestError as exc:
        raise bad_request(exc.reason, "prompt", "invalid_prompt") from None
    except asyncio.CancelledError:  # the client disconnected
        live.cancel(future)
        raise
    except Exception as exc:
        raise APIError(500, f"the engine failed: {type(exc).__name__}: {exc}", code="engine_error") from None
    finally:
        live.share.release(owner, held)


def _tokenizer(request: Request) -> Any:
    return request.app.state.live_engine.tokenizer


@router.post("/completions")
async def completions(request: Request, owner: Owner, body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
    settings = request.app.state.settings
    check_model(body, settings.model_name)
    tokenizer = await asyncio.to_thread(_tokenizer, request)
    ask = await asyncio.to_thread(completion_ask, body, tokenizer)
    outs = await _run(request, owner, ask.prompts, ask.params)
    return await asyncio.to_thread(completion_body, ask, outs, settings.model_name, tokenizer)


@router.post("/chat/completions")
async def chat_completions(request: Request, owner: Owner, body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
    settings = request.app.state.settings
    check_model(body, settings.model_name)
    tokenizer = await asyncio.to_thread(_tokenizer, request)
    ask = await asyncio.to_thread(chat_ask, body, tokenizer, settings.default_max_tokens)
    (out,) = await _run(request, owner, ask.prompts, ask.params)
    return chat_body(ask, out, settings.model_name, tokenizer)
