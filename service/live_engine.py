"""The engine behind the synchronous routes: one thread steps one engine for every HTTP request.

Each live request hands its prompts to this thread, which adds them to the running engine between
steps (continuous batching) and resolves the request's future when its last prompt finishes. The engine is an ``EngineShare``'s (``pipeline/engine_share.py``): in
``tokenmill serve`` without a broker, the same one the embedded runner's jobs step, with this
thread's requests first in line (``LIVE_PRIORITY``); each side aborts and hears of only its own
requests. It is built with ``--model`` and ``--engine-options`` at ``start`` (``tokenmill serve``
calls it) or on the first request (or a job's), then warmed with one short request; ``ready``
says when both are done (``/readyz``).

A call may pass a ``listener``: after every step it gets the call's new tokens and finished prompts
(``Progress``), on the engine thread, which is what the streaming routes read. A call cancelled
because its client went away is aborted at the next step: its sequences free their KV blocks at
once (``aborted`` counts them). Prompts reach the engine through the keys' fair share
(``service/fair_share.py``): one key's prompt at a time, in rotation, while the batch has room.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import fields as dataclass_fields
from typing import Any

from engine import EngineConfig, RequestError, SamplingParams
from engine.host import objects_frozen_during_call
from engine.model_loader import load_tokenizer
from engine.model_registry import resolve_model
from pipeline.engine_share import LIVE_PRIORITY, EngineShare, EngineView
from service.fair_share import FairShare
from service.live_calls import Listener, Progress, _Call
from service.live_metrics import LiveMetrics

log = logging.getLogger(__name__)


def engine_settings(model: str, engine_options: dict[str, Any]) -> dict[str, Any]:
    """EngineConfig keyword arguments from the server's options (others, e.g. job-only ones, dropped)."""
    known = {f.name for f in dataclass_fields(EngineConfig)}
    return {"model": model, **{k: v for k, v in engine_options.items() if k in known and k != "model"}}


class LiveEngine:
    def __init__(self, settings: dict[str, Any], model_name: str | None = None,
                 share: FairShare | None = None, engines: EngineShare | None = None) -> None:
        self.settings = settings
        self.engines = engines or EngineShare(settings)  # shared with the jobs in an embedded server
        self._view = self.engines.view("live", LIVE_PRIORITY, self._wake)
        self.metrics = LiveMetrics(model_name or str(settings["model"]))
        self.share = share or FairShare()  # the engine is fed from it, one key's prompt at a time
        self.batch = int(settings.get("max_num_seqs") or 64)
        self._cond = threading.Condition()
        self._incoming: deque[_Call] = deque()
        self._cancelled: deque[_Call] = deque()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._tokenizer: Any = None
        self.engine: EngineView | None = None  # this thread's side of the engine, once built and warmed
        self.ready = False  # built and warmed
        self.load_error: str | None = None  # why the last build failed
        self.aborted = 0  # engine requests aborted because their client went away

    @property
    def tokenizer(self) -> Any:
        """A tokenizer of the served model for the request threads (the engine keeps its own)."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(resolve_model(self.settings["model"]))
        return self._tokenizer

    def start(self) -> None:
        """Build and warm the engine now, on its thread, rather than on the first request."""
        with self._cond:
            self._start_thread()

    def _start_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._serve, name="tokenmill-live-engine", daemon=True)
            self._thread.start()

    def submit(self, prompts: list[list[int]], params: list[SamplingParams], listener: Listener | None = None,
               owner: str = "") -> Future:
        """Queue the prompts; the future gives their outputs in order, or raises the engine's
        ``RequestError`` for the first one it refuses (the others are then withdrawn). A
        ``listener`` is called with ``[]`` once all prompts are in, then after each step that
        moves them on."""
        call = _Call(prompts, params, Future(), listener, time.monotonic(), owner=owner)
        with self._cond:
            self._incoming.append(call)
            self._start_thread()
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

    def _wake(self) -> None:
        """A job's step finished one of this thread's requests."""
        with self._cond:
            self._cond.notify_all()

    def _build(self) -> EngineView | None:
        try:
            engine = self._view
            engine.add_request("live-warm-up", [min(engine.eos_token_ids, default=0)],
                               SamplingParams(max_tokens=1, ignore_eos=True))
            while engine.has_unfinished():
                engine.step()
        except BaseException as exc:  # every waiting request learns why, and the next one tries again
            log.exception("cannot build the engine for the completions routes")
            with self._cond:
                calls, self._incoming = list(self._incoming), deque()
                self._thread = None
                self.load_error = f"{type(exc).__name__}: {exc}"
            for call in calls:
                call.future.set_exception(exc)
            return None
        self.metrics.start(engine)
        self.engine, self.ready, self.load_error = engine, True, None
        return engine

    def _serve(self) -> None:
        engine = self._build()
        if engine is None:
            return
        in_flight: dict[str, _Call] = {}
        while True:
            with self._cond:
                while not self._has_work(engine):
                    self._cond.wait()
            # A busy spell, to the next idle wait: the objects older than it stay out of the
            # cyclic collector's walks (engine/host.py), as in LLM.generate.
            with objects_frozen_during_call():
                while True:
                    try:
                        self._turn(engine, in_flight)
                    except Exception as exc:  # outside the step's own guard: fail the calls, keep serving
                        log.exception("the completions engine's turn failed")
                        self._fail_all(engine, in_flight, exc)
                    with self._cond:
                        if not self._has_work(engine):
                            break

    def _has_work(self, engine: EngineView) -> bool:
        return bool(self._incoming or self._cancelled or self.share.waiting()) or engine.has_unfinished()

    def _turn(self, engine: EngineView, in_flight: dict[str, _Call]) -> None:
        """Take the new and cancelled calls, then run one step: all under the engine's turn, so a
        job's step never moves the engine while this reads its requests' new tokens."""
        with self.engines.lock:
            self._turn_locked(engine, in_flight)

    def _turn_locked(self, engine: EngineView, in_flight: dict[str, _Call]) -> None:
        with self._cond:
            new, self._incoming = list(self._incoming), deque()
            gone, self._cancelled = list(self._cancelled), deque()
        for call in new:
            self.share.push(call.owner, call, len(call.prompts))
        for stub in gone:
            self.share.drop(stub.future)
            self.aborted += self._abort(engine, stub.future, in_flight)
        room = self.batch - sum(c.params[0].n for c in in_flight.values())
        for call, index in self.share.take(room, self.batch, lambda c, i: c.params[i].n):
            if call.future.done():
                continue
            try:
                self._add(engine, call, index, in_flight)
            except Exception as exc:  # that call fails; the others taken with it still go in
                log.exception("cannot add a completions request")
                self.share.drop(call.future)
                self._abort(engine, call.future, in_flight, exc)
        if not engine.has_unfinished():
            self.metrics.gauges(engine)  # (aborts may have emptied it: no step will say so)
            return
        started = time.monotonic()
        try:
            finished = engine.step()
        except Exception as exc:  # a step the engine could not isolate: fail what it holds
            log.exception("completions engine step failed")
            finished = []
            for call in {id(c): c for c in in_flight.values()}.values():
                self.share.drop(call.future)
                self._abort(engine, call.future, in_flight, exc)
        now = time.monotonic()
        self.metrics.after_step(engine, started, now)
        updates: dict[int, tuple[_Call, list[Progress]]] = {}
        for request_id, call in in_flight.items():
            if call.listener is not None:
                self._new_tokens(engine, request_id, call, updates)
        done: list[_Call] = []
        for out in finished:
            self.metrics.finished(out, started, now)
            call = in_flight.pop(out.request_id, None)
            if call is None:
                continue
            call.outputs[out.request_id] = out
            if call.listener is not None:
                updates.setdefault(id(call), (call, []))[1].append(Progress(call.ids.index(out.request_id), output=out))
            if len(call.outputs) == len(call.prompts):
                done.append(call)
        for call, progress in updates.values():
            self._tell(call, progress)
        for call in done:
            if not call.future.done():
                call.future.set_result([call.outputs[i] for i in call.ids])

    @staticmethod
    def _new_tokens(engine: EngineView, request_id: str, call: _Call,
                    updates: dict[int, tuple[_Call, list[Progress]]]) -> None:
        """The tokens a running request's samples sampled since the call was last told."""
        state = engine.requests.get(request_id)
        for seq in state.seqs if state is not None else ():
            ready = seq.num_output_tokens - seq.num_pending_tokens  # an overlapped step's placeholder is not one
            key = (request_id, seq.sample_index)
            told = call.told.get(key, 0)
            if ready > told:
                tokens = seq.token_ids[seq.num_prompt_tokens + told : seq.num_prompt_tokens + ready]
                entries = None if seq.logprobs is None else list(seq.logprobs[told:ready])
                call.told[key] = ready
                updates.setdefault(id(call), (call, []))[1].append(
                    Progress(call.ids.index(request_id), seq.sample_index, tokens, logprobs=entries))

    @staticmethod
    def _tell(call: _Call, progress: list[Progress]) -> None:
        try:
            call.listener(progress)
        except Exception:  # a listener's fault is its call's, never the engine thread's
            log.exception("a completions listener failed")

    def _add(self, engine: EngineView, call: _Call, index: int, in_flight: dict[str, _Call]) -> None:
        """Prompt ``index`` of ``call`` into the engine (a call's prompts come in order); its
        listener hears ``[]`` once the last one is in."""
        request_id = f"live-{next(self._ids)}"
        try:
            engine.add_request(request_id, call.prompts[index], call.params[index])
        except RequestError as exc:
            self.share.drop(call.future)
            self._abort(engine, call.future, in_flight, RequestError(None, exc.reason))
            return
        call.ids.append(request_id)
        in_flight[request_id] = call
        self.metrics.arrived(request_id, call.arrived)
        if call.listener is not None and len(call.ids) == len(call.prompts):
            self._tell(call, [])

    def _fail_all(self, engine: EngineView, in_flight: dict[str, _Call], error: Exception) -> None:
        """Every call in flight fails with ``error``: none waits (or streams) forever."""
        calls = list({id(c): c for c in in_flight.values()}.values())
        for request_id in list(in_flight):
            self.metrics.dropped(request_id)
            try:
                engine.abort_request(request_id)
            except Exception:
                log.exception("cannot abort %s", request_id)
        in_flight.clear()
        for call in calls:
            self.share.drop(call.future)
            if not call.future.done():
                call.future.set_exception(error)

    def _abort(self, engine: EngineView, future: Future, in_flight: dict[str, _Call],
               error: BaseException | None = None) -> int:
        """Drop a call's requests from the engine; returns how many it still held."""
        dropped = [r for r, c in in_flight.items() if c.future is future]
        for request_id in dropped:
            engine.abort_request(request_id)
            self.metrics.dropped(request_id)
            del in_flight[request_id]
        if error is not None and not future.done():
            future.set_exception(error)
        return len(dropped)
