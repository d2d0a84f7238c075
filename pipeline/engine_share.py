"""One engine stepped in turn by several owners: in ``tokenmill serve`` without a broker, the live
routes' thread and the embedded runner's jobs hold one copy of the model, not two.

Each owner works through its own ``EngineView`` (the members of ``pipeline.shard_engine.ShardEngine``,
so a ``ShardDriver`` takes one as it takes an engine). Every engine call goes through the share's
turn lock, first come first served, so the two threads never touch the engine at once and
neither waits more than the other's call. A step, whoever takes it, moves every owner's
requests on; the finished outputs of the others go to their mailboxes (and ``wake`` tells them),
each owner's ``step`` returns only its own. An owner aborts only its own requests (``abort_all``
included, which a driver's run starts with); its requests carry its ``priority`` (the live
routes' -1 goes ahead of the jobs' 0, ``engine/scheduler.py``).

A step that raises (no single request's fault: the engine isolates those) leaves the engine's
state unknown: the share builds a fresh engine at once and the step's exception goes to the
owner that took it; every other owner with requests in the old engine gets an ``EngineReset``
from its next ``step`` (after the outputs already in its mailbox), so both sides fail what they
had in it and carry on with the new engine. ``stats`` counts the owner's own work: the other
owners' prompt, decode and prefix-cache tokens (from their finished outputs) are taken out of
the engine's counters; steps, preemptions and peaks stay the engine's, shared.
"""

from __future__ import annotations

import logging
import os
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from engine import EngineConfig, LLMEngine, RequestOutput
from engine.request_state import RequestState

log = logging.getLogger(__name__)

LIVE_PRIORITY = -1  # the live routes' requests: ahead of the jobs' (0) in the scheduler's queues
_TALLIED = ("prompt_tokens_computed", "decode_tokens", "prefix_cache_query_tokens", "prefix_cache_hit_tokens")


class EngineReset(RuntimeError):
    """The shared engine was rebuilt after another owner's step failed: this owner's requests in
    it are gone."""


def same_engine(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two sets of engine settings build the same engine (defaults filled in, a model
    folder compared by its real path)."""
    def normal(settings: dict[str, Any]) -> EngineConfig | None:
        try:
            config = EngineConfig(**settings)
        except (TypeError, ValueError):  # no engine setting, or a bad value: not ours to share
            return None
        model = str(config.model)
        if os.path.isdir(model):
            config.model = os.path.realpath(model)
        return config

    first = normal(a)
    return first is not None and first == normal(b)


class TurnLock:
    """A reentrant lock handed out in the order it was asked for: with two threads calling the
    engine in a loop, each waits for at most one call of the other."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._next = self._serving = 0
        self._holder: int | None = None
        self._depth = 0

    def __enter__(self) -> TurnLock:
        me = threading.get_ident()
        with self._cond:
            if self._holder == me:
                self._depth += 1
                return self
            ticket, self._next = self._next, self._next + 1
            while self._serving != ticket:
                self._cond.wait()
            self._holder, self._depth = me, 1
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._depth -= 1
            if self._depth == 0:
                self._holder = None
                self._serving += 1
                self._cond.notify_all()


@dataclass
class _Tally:
    """What one owner's finished requests cost, per counter of ``_TALLIED``."""

    prompt_tokens_computed: int = 0
    decode_tokens: int = 0
    prefix_cache_query_tokens: int = 0
    prefix_cache_hit_tokens: int = 0

    def add(self, out: RequestOutput) -> None:
        prompt, cached = len(out.prompt_token_ids), out.metrics.num_cached_prompt_tokens
        self.prompt_tokens_computed += prompt - cached
        self.prefix_cache_query_tokens += prompt
        self.prefix_cache_hit_tokens += cached
        self.decode_tokens += sum(len(c.token_ids) for c in out.outputs)

    def add_aborted(self, state: RequestState) -> None:
        """What an aborted request had cost so far."""
        seq = state.seqs[0]
        if seq.first_scheduled_step is not None:
            cached = seq.num_cached_prompt_tokens
            self.prompt_tokens_computed += min(seq.num_computed_tokens, seq.num_prompt_tokens) - cached
            self.prefix_cache_query_tokens += seq.num_prompt_tokens
            self.prefix_cache_hit_tokens += cached
        self.decode_tokens += sum(s.num_output_tokens - s.num_pending_tokens for s in state.seqs)


class EngineShare:
    """The process's one engine for ``settings``, built by whichever owner needs it first."""

    def __init__(self, settings: dict[str, Any], build: Callable[[], LLMEngine] | None = None) -> None:
        self.settings = settings
        self._build = build or (lambda: LLMEngine(EngineConfig(**settings)))
        self.lock = TurnLock()
        self._engine: LLMEngine | None = None
        self._owner_of: dict[str, EngineView] = {}  # request id -> the view that added it
        self.views: list[EngineView] = []
        self.builds = 0  # engines built (one, unless a failed step made it rebuild)

    def matches(self, settings: dict[str, Any]) -> bool:
        return same_engine(settings, self.settings)

    @property
    def engine(self) -> LLMEngine:
        with self.lock:
            if self._engine is None:
                self._engine = self._build()
                self.builds += 1
            return self._engine

    def view(self, owner: str, priority: int = 0, wake: Callable[[], None] | None = None) -> EngineView:
        """A new owner of the engine: its requests go in with ``priority``; ``wake`` is called
        (outside the lock) when another owner's step finished one of them."""
        view = EngineView(self, owner, priority, wake)
        with self.lock:
            self.views.append(view)
        return view

    def leave(self, view: EngineView) -> None:
        """The owner is done: its requests are aborted, and it is forgotten."""
        with self.lock:
            view.abort_all()
            if view in self.views:
                self.views.remove(view)

    def step(self, caller: EngineView) -> tuple[list[RequestOutput], list[EngineView]]:
        """One engine step for everyone (under the lock): ``caller``'s finished outputs, and the
        other owners whose mailboxes it filled (for the caller to wake once it lets go)."""
        engine = self.engine
        failure = None
        try:
            outputs = engine.step()
        except Exception as exc:
            failure = exc
        if failure is not None:
            engine = None  # (this frame is in the traceback raised below)
            self._reset(caller, failure)
            failure.__traceback__ = None  # logged; its frames would keep the old engine (and its KV) alive
            raise failure
        mine: list[RequestOutput] = []
        woken: dict[int, EngineView] = {}
        for out in outputs:
            view = self._owner_of.pop(out.request_id, None)
            if view is None:
                continue
            view.ids.discard(out.request_id)
            view.tally.add(out)
            if view is caller:
                mine.append(out)
            else:
                view.mailbox.append(out)
                woken[id(view)] = view
        return mine, list(woken.values())

    def _reset(self, caller: EngineView, error: Exception) -> None:
        """The engine failed outside any one request: a fresh one, every owner's requests gone."""
        log.error("shared engine step failed (%s's turn); rebuilding it\n%s", caller.owner,
                  "".join(traceback.format_exception(error)))
        reason = f"the engine was rebuilt after a step failed: {type(error).__name__}: {error}"
        for view in self.views:
            if view is not caller and view.ids:
                view.lost = reason
            view.ids.clear()
            view.tally = _Tally()  # the new engine counts from zero
        self._owner_of.clear()
        old, self._engine = self._engine, None
        if old is not None:
            old.close()
        try:
            self.engine  # noqa: B018 (builds it)
        except Exception:  # the next call tries again; this one still reports the step's error
            log.exception("cannot rebuild the shared engine")


class EngineView:
    """One owner's side of an ``EngineShare``: its own requests, outputs and counters. Other
    attributes (``scheduler``, ``requests``, ``tokenizer``...) are the engine's, read as they are."""

    def __init__(self, share: EngineShare, owner: str, priority: int, wake: Callable[[], None] | None) -> None:
        self.share, self.owner, self.priority, self._wake = share, owner, priority, wake
        self.ids: set[str] = set()  # its requests in the engine
        self.mailbox: list[RequestOutput] = []  # its outputs finished in another owner's step
        self.lost: str | None = None  # set when a rebuild dropped its requests; raised by step
        self.tally = _Tally()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.share.engine, name)

    def wake_up(self) -> None:
        if self._wake is not None:
            try:
                self._wake()
            except Exception:
                log.exception("waking %s failed", self.owner)

    def add_request(self, request_id: str, prompt: str | list[int], params: Any = None) -> None:
        with self.share.lock:
            self.share.engine.add_request(request_id, prompt, params, priority=self.priority)
            self.ids.add(request_id)
            self.share._owner_of[request_id] = self

    def abort_request(self, request_id: str) -> None:
        with self.share.lock:
            if request_id in self.ids:
                self.ids.discard(request_id)
                self.share._owner_of.pop(request_id, None)
                engine = self.share.engine
                state = engine.requests.get(request_id)
                if isinstance(state, RequestState):
                    self.tally.add_aborted(state)
                engine.abort_request(request_id)

    def abort_all(self) -> list[str]:
        """Abort this owner's requests (never another's); its undelivered outputs are dropped."""
        with self.share.lock:
            ids = sorted(self.ids)
            for request_id in ids:
                self.abort_request(request_id)
            self.mailbox.clear()
            self.lost = None
            return ids

    def feed_requests(self, *args: Any, **kwargs: Any) -> None:
        """Not through a view: a feed's callbacks run on whichever owner steps."""
        raise TypeError(f"{self.owner}: a shared engine takes requests through add_request, not a feed")

    def has_unfinished(self) -> bool:
        """Its requests in the engine, outputs waiting for it, or a reset to learn of (no lock:
        the live thread asks under its own condition)."""
        return bool(self.ids or self.mailbox or self.lost)

    def step(self) -> list[RequestOutput]:
        """Its outputs finished since its last call: those of other owners' steps first (without
        stepping, if it has nothing in the engine), then of one step; or ``EngineReset``."""
        woken: list[EngineView] = []
        try:
            with self.share.lock:
                delivered, self.mailbox = self.mailbox, []
                if delivered and not self.ids:
                    return delivered
                if self.lost is not None:
                    if delivered:
                        return delivered
                    reason, self.lost = self.lost, None
                    raise EngineReset(reason)
                if not self.ids:
                    return delivered
                mine, woken = self.share.step(self)
                return delivered + mine
        finally:  # outside the lock: a woken owner may take its own lock first
            for view in woken:
                view.wake_up()

    def stats(self) -> dict[str, Any]:
        """The engine's counters less the other owners' tallied tokens (``_TALLIED``)."""
        with self.share.lock:
            out = self.share.engine.stats()
            for view in self.share.views:
                if view is not self:
                    for name in _TALLIED:
                        out[name] -= getattr(view.tally, name)
            return out


assert {f.name for f in fields(_Tally)} == set(_TALLIED)
