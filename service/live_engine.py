"""The engine behind the synchronous routes: one thread steps one engine for every HTTP request.

Concurrent ``/v1/completions`` and ``/v1/chat/completions`` requests do not take turns: each
hands its prompts to this thread, which adds them to the running engine between steps
(continuous batching across requests) and resolves the request's future when its last prompt
finishes. All engine calls happen on this thread.

The engine is its own, not the process's cached one (``pipeline.engine_cache``): that one
belongs to the embedded runner's thread, which steps it for batch jobs, and two threads may
not step one engine. It is built on the first request, with the server's ``--model`` and
``--engine-options``.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any

from engine import EngineConfig, LLMEngine, RequestError, RequestOutput, SamplingParams
from engine.host import objects_frozen_during_call
from service.fair_share import FairShare

log = logging.getLogger(__name__)


@dataclass
class _Call:
    """One HTTP request's prompts; ``outputs`` fill in as they finish."""

    prompts: list[list[int]]
    params: list[SamplingParams]
    future: Future
    owner: str = ""  # the key's owner id: its turn in the fair share
    ids: list[str] = field(default_factory=list)
    outputs: dict[str, RequestOutput] = field(default_factory=dict)


def engine_settings(model: str, engine_options: dict[str, Any]) -> dict[str, Any]:
    """EngineConfig keyword arguments from the server's options (others, e.g. job-only ones, dropped)."""
    known = {f.name for f in dataclass_fields(EngineConfig)}
    return {"model": model, **{k: v for k, v in engine_options.items() if k in known and k != "model"}}


class LiveEngine:
    def __init__(self, settings: dict[str, Any], share: FairShare | None = None) -> None:
        self.settings = settings
        self.share = share or FairShare()  # the engine is fed from it, one key's prompt at a time
        self.batch = int(settings.get("max_num_seqs") or 64)
        self._cond = threading.Condition()
        self._incoming: deque[_Call] = deque()
        self._cancelled: deque[_Call] = deque()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._tokenizer: Any = None
        self.engine: LLMEngine | None = None  # set on the engine thread once built (stats for the curious)

    @property
    def tokenizer(self) -> Any:
        """A tokenizer of the served model for the request threads (the engine keeps its own)."""
        if self._tokenizer is None:
            from engine.model_loader import load_tokenizer
            from engine.model_registry import resolve_model

            self._tokenizer = load_tokenizer(resolve_model(self.settings["model"]))
        return self._tokenizer

    def submit(self, prompts: list[list[int]], params: list[SamplingParams], owner: str = "") -> Future:
        """Queue the prompts; the future gives their outputs in order, or raises the engine's
        ``RequestError`` for the first one it refuses (the others are then withdrawn)."""
        call = _Call(prompts, params, Future(), owner)
        with self._cond:
            self._incoming.append(call)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="tokenmill-live-engine", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return call.future

    def cancel(self, future: Future) -> None:
        """The client went away: its prompts stop taking engine steps."""
        with self._cond:
            for call in list(self._incoming):
                if call.future is future:
                    self._incoming.remove(call)
                    return
            self._cancelled.append(_Call([], [], future))
            self._cond.notify_all()

    def _serve(self) -> None:
        try:
            engine = LLMEngine(EngineConfig(**self.settings))
        except BaseException as exc:  # every waiting request learns why, and the next one tries again
            log.exception("cannot build the engine for the completions routes")
            with self._cond:
                calls, self._incoming = list(self._incoming), deque()
                self._thread = None
            for call in calls:
                call.future.set_exception(exc)
            return
        self.engine = engine
        live: dict[str, _Call] = {}
        while True:
            with self._cond:
                while not self._has_work(engine):
                    self._cond.wait()
            # A busy spell, to the next idle wait: the objects older than it stay out of the
            # cyclic collector's walks (engine/host.py), as in LLM.generate.
            with objects_frozen_during_call():
                while True:
                    self._turn(engine, live)
                    with self._cond:
                        if not self._has_work(engine):
                            break

    def _has_work(self, engine: LLMEngine) -> bool:
        return bool(self._incoming or self._cancelled or self.share.waiting()) or engine.has_unfinished()

    def _turn(self, engine: LLMEngine, live: dict[str, _Call]) -> None:
        """Take the new and cancelled calls, then run one step."""
        with self._cond:
            new, self._incoming = list(self._incoming), deque()
            gone, self._cancelled = list(self._cancelled), deque()
        for call in new:
            self.share.push(call.owner, call, len(call.prompts))
        for stub in gone:
            self.share.drop(stub.future)
            self._abort(engine, stub.future, live)
        room = self.batch - sum(c.params[0].n for c in live.values())
        for call, index in self.share.take(room, self.batch, lambda c, i: c.params[i].n):
            if not call.future.done():
                self._add(engine, call, index, live)
        if not engine.has_unfinished():
            return
        try:
            finished = engine.step()
        except Exception as exc:  # a step the engine could not isolate: fail what it holds
            log.exception("completions engine step failed")
            finished = []
            for call in {id(c): c for c in live.values()}.values():
                self.share.drop(call.future)
                self._abort(engine, call.future, live, exc)
        for out in finished:
            call = live.pop(out.request_id, None)
            if call is None:
                continue
            call.outputs[out.request_id] = out
            if len(call.outputs) == len(call.prompts) and not call.future.done():
                call.future.set_result([call.outputs[i] for i in call.ids])

    def _add(self, engine: LLMEngine, call: _Call, index: int, live: dict[str, _Call]) -> None:
        """Prompt ``index`` of ``call`` into the engine (a call's prompts come in order)."""
        request_id = f"live-{next(self._ids)}"
        try:
            engine.add_request(request_id, call.prompts[index], call.params[index])
        except RequestError as exc:
            self.share.drop(call.future)
            self._abort(engine, call.future, live, RequestError(None, exc.reason))
            return
        call.ids.append(request_id)
        live[request_id] = call

    @staticmethod
    def _abort(engine: LLMEngine, future: Future, live: dict[str, _Call], error: BaseException | None = None) -> None:
        for request_id in [r for r, c in live.items() if c.future is future]:
            engine.abort_request(request_id)
            del live[request_id]
        if error is not None and not future.done():
            future.set_exception(error)
