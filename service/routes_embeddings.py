"""``POST /v1/embeddings``: answered by the server's live engine (``service.live_engine``) beside
the completions, behind the same key and body limits (``service.guard``). Each input is one
embedding request of the engine: its prompt computed once, pooled as the model says, its KV
blocks freed in the same step."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from engine import PoolingParams
from jobs.openai_embeddings import EmbeddingRequest, embeddings_body
from service.auth import Owner
from service.completions import check_model
from service.errors import bad_request
from service.routes_completions import _run, _tokenizer

router = APIRouter(prefix="/v1")


@router.post("/embeddings")
async def embeddings(request: Request, owner: Owner, body: EmbeddingRequest) -> dict:
    settings = request.app.state.settings
    check_model(body.model, settings.model_name)
    tokenizer = await asyncio.to_thread(_tokenizer, request)
    try:
        prompts = await asyncio.to_thread(body.token_ids, tokenizer)
    except ValueError as exc:
        raise bad_request(str(exc), "input", "invalid_value") from None
    params = PoolingParams(dimensions=body.dimensions)
    outs = await _run(request, owner, prompts, [params] * len(prompts))
    return await asyncio.to_thread(embeddings_body, [o.embedding for o in outs], sum(map(len, prompts)),
                                   settings.model_name, body.encoding_format)
