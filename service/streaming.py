"""``stream: true`` on the live routes: server-sent events in the shape the ``openai`` client reads.

Each event is ``data: {chunk}``; the stream ends with ``data: [DONE]``. Chunks carry the text a
choice's new tokens add (``text_completion`` chunks for ``/v1/completions``,
``chat.completion.chunk`` with a ``delta`` for chat, whose first chunk per choice gives the
role, and with ``logprobs`` its new tokens' entries); a choice's last chunk has its
``finish_reason``. With ``stream_options.include_usage``
one more chunk, with no choices, gives the usage. A client that goes away cancels the
generator, which cancels the call: the engine aborts its sequences at the next step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from engine import RequestError
from jobs.openai_responses import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatDelta,
    Completion,
    CompletionChoice,
    ToolCallDelta,
    Usage,
)
from pipeline.openai_output import logprobs_content
from service.completions import EngineAsk, refused_prompt
from service.errors import APIError
from service.live_engine import LiveEngine, Progress

log = logging.getLogger(__name__)

_INCOMPLETE = "\ufffd"  # what a decode of a partial UTF-8 character ends with


@dataclass
class _Text:
    """One choice's text as its tokens arrive. Each time the whole output is decoded (so a token
    whose text depends on its neighbours comes out right); the last ``hold`` characters stay back
    until the choice ends, since they may be the start of a stop string the engine will cut."""

    tokenizer: Any
    hold: int
    ids: list[int] = field(default_factory=list)
    sent: str = ""

    def add(self, token_ids: list[int]) -> str:
        self.ids.extend(token_ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        end = len(text) - self.hold
        if text.endswith(_INCOMPLETE) or end <= len(self.sent) or not text.startswith(self.sent):
            return ""
        piece = text[len(self.sent) : end]
        self.sent += piece
        return piece

    def finish(self, final: str) -> str:
        """The rest of the finished choice's text (the engine's, with any stop string cut)."""
        return final[len(self.sent) :] if final.startswith(self.sent) else ""


class OpenCall(NamedTuple):
    """A call the engine took: its result, and the queue its progress arrives on (None: done)."""

    future: Future
    queue: asyncio.Queue


async def open_call(live: LiveEngine, ask: EngineAsk, owner: str = "") -> OpenCall:
    """Submit the call and wait until the engine took all its prompts: a prompt it refuses is
    still a plain 400, before any event is sent."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[list[Progress] | None] = asyncio.Queue()
    future = live.submit(ask.prompts, ask.params, lambda progress: loop.call_soon_threadsafe(queue.put_nowait, progress),
                         owner=owner)
    future.add_done_callback(lambda _: loop.call_soon_threadsafe(queue.put_nowait, None))
    try:
        first = await queue.get()
    except asyncio.CancelledError:  # the client went away while the prompts were queued
        live.cancel(future)
        raise
    if first is None:
        try:
            future.result()
        except RequestError as exc:
            raise refused_prompt(exc.reason, ask) from None
        except Exception as exc:
            raise APIError(500, f"the engine failed: {type(exc).__name__}: {exc}", code="engine_error") from None
    return OpenCall(future, queue)


class EventStream(StreamingResponse):
    """The SSE response of one call. Once it ends, however it ends, a call still running is
    cancelled: a client that hangs up before the first chunk was pulled never starts the
    ``events`` generator, so its ``finally`` would never run."""

    def __init__(self, lines: AsyncIterator[str], live: LiveEngine, future: Future,
                 on_end: Callable[[], None] | None = None) -> None:
        super().__init__(lines, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.live, self.future, self.on_end = live, future, on_end

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.future.done():
                self.live.cancel(self.future)
            if self.on_end is not None:
                self.on_end()


def _event(data: BaseModel | dict[str, Any] | str) -> str:
    if isinstance(data, BaseModel):
        data = data.model_dump_json()
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def _tool_chunk(chunk: Any, index: int, ask: EngineAsk, text: str, finish: str) -> str:
    """A forced tool call's one chunk: the whole call (or, cut by max_tokens, the plain text)."""
    message, finish = ask.tools.message(text, finish)
    if not message.tool_calls:
        return chunk(index, message.content, finish)
    calls = [ToolCallDelta(index=i, **call.model_dump()) for i, call in enumerate(message.tool_calls)]
    return chunk(index, None, finish, delta=ChatDelta(tool_calls=calls))


async def events(live: LiveEngine, ask: EngineAsk, future: Future, queue: asyncio.Queue, *, chat: bool,
                 model: str, tokenizer: Any, include_usage: bool) -> AsyncIterator[str]:
    """The call's chunks as SSE lines, then ``[DONE]``."""
    made = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", "created": int(time.time()),
            "model": model}
    hold = max((len(s) for p in ask.params for s in p.stop), default=1) - 1
    texts: dict[int, _Text] = {}
    prompt_tokens = completion_tokens = 0

    def chunk(index: int, text: str | None, finish: str | None = None, role: bool = False,
              tokens: tuple[list[int], list[Any] | None] = ([], None), delta: ChatDelta | None = None) -> str:
        if chat:
            if delta is None:
                delta = ChatDelta(role="assistant", content="") if role else ChatDelta(content=text or None)
            logprobs = None
            if ask.logprobs is not None and tokens[1]:
                logprobs = {"content": logprobs_content(tokens[0], tokens[1], ask.logprobs, tokenizer),
                            "refusal": None}
            return _event(ChatCompletionChunk(**made, choices=[ChatChunkChoice(index=index, delta=delta,
                                                                                logprobs=logprobs,
                                                                                finish_reason=finish)]))
        return _event(Completion(**made, choices=[CompletionChoice(index=index, text=text or "",
                                                                   finish_reason=finish)]))

    try:
        try:
            if chat:
                for index in range(len(ask.prompts) * ask.n):
                    yield chunk(index, None, role=True)
            while (progress := await queue.get()) is not None:
                for p in progress:
                    if p.output is None:
                        index = p.prompt * ask.n + p.sample
                        piece = texts.setdefault(index, _Text(tokenizer, hold)).add(p.token_ids)
                        if ask.tools is not None:
                            continue  # a forced tool call is sent whole, once it is complete
                        if piece or p.logprobs:
                            yield chunk(index, piece, tokens=(p.token_ids, p.logprobs))
                        continue
                    prompt_tokens += len(p.output.prompt_token_ids)
                    for c in p.output.outputs:
                        index = p.prompt * ask.n + c.index
                        completion_tokens += len(c.token_ids)
                        text = texts.setdefault(index, _Text(tokenizer, hold))
                        seen = len(text.ids)  # the last step's tokens come with the finished output only
                        rest = (c.token_ids[seen:], None if c.logprobs is None else c.logprobs[seen:])
                        if ask.tools is not None:
                            yield _tool_chunk(chunk, index, ask, c.text, c.finish_reason or "stop")
                            continue
                        yield chunk(index, text.finish(c.text), c.finish_reason or "stop", tokens=rest)
            future.result()
        except Exception as exc:  # the engine's or this stream's: the status line is sent, so it is an event
            if not future.done():
                live.cancel(future)
            log.warning("a streamed answer failed: %s: %s", type(exc).__name__, exc)
            error = APIError(500, f"the answer failed: {type(exc).__name__}: {exc}", code="engine_error")
            yield _event(error.body())
        else:
            if include_usage:
                last = ChatCompletionChunk if chat else Completion
                yield _event(last(**made, choices=[], usage=Usage.of(prompt_tokens, completion_tokens)))
        yield _event("[DONE]")
    finally:
        if not future.done():  # the client went away (or the response failed): stop its sequences
            live.cancel(future)
