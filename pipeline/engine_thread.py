"""One thread per worker process owns the engine; shard tasks hand it shards and wait.

A Celery task runs one shard start to finish, so a worker that runs the engine inside
the task drains the batch at every shard boundary: the last long requests of a shard
decode alone until the next task arrives. Here the shard tasks (Celery's ``threads``
pool, several at once) only queue their shard and wait for its result, while this
engine thread keeps one ``ShardDriver`` running over a live feed of those
shards: the next shard's rows are admitted while the previous one's tail still decodes.

Only shards of the same plan share a run (one plan = one prompt, sampling and output
schema). When a shard of another plan is waiting, the current run takes no new shards,
finishes the ones it has, and the next run starts with the waiting plan: no job starves.
All engine calls happen on the engine thread (one CUDA context, no torch cross-thread use).

Shutdown (``drain``, on SIGTERM): no new shards are taken, shards queued but not yet open
are handed back at once, open shards may finish within the grace period, and whatever is
still open then is handed back too: its finished rows are checkpointed (when the plan
checkpoints), its future raises ``ShardHandedBack`` (the task requeues the message) and
nothing else is reported or committed for it; whoever takes it next starts after the
checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from connectors import ShardRef
from pipeline.engine_cache import get_engine, rebuild_engine
from pipeline.metrics import step_observer
from pipeline.plan import JobPlan
from pipeline.shard_driver import ShardDriver
from pipeline.shard_outcome import ShardOutcome, ShardState
from pipeline.shard_reports import ProgressCallback

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5


class ShardHandedBack(Exception):
    """The worker is shutting down and gives this shard back unfinished (to be requeued)."""


@dataclass
class _ShardTask:
    plan: JobPlan
    plan_key: str
    shard: ShardRef
    on_progress: ProgressCallback | None
    should_stop: Callable[[], bool] | None
    worker: str
    future: Future


def plan_key(plan: JobPlan) -> str:
    return json.dumps(plan.to_dict(), sort_keys=True, default=str)


class _PlanFeed:
    """The engine thread's queued shards of one plan, as a ``ShardFeed`` for one driver run."""

    def __init__(self, thread: EngineThread, key: str) -> None:
        self.thread, self.key = thread, key
        self._taken: dict[int, _ShardTask] = {}  # the shards this run holds open, by index
        self.closed = False  # set once another plan's shard waits: this run takes no more
        self.handing_back = False  # the grace period ran out: open shards are given back

    def next_shard(self, wait: bool) -> ShardRef | None:
        task = self.thread.take_task(self, wait)
        if task is None:
            return None
        self._taken[task.shard.index] = task
        return task.shard

    def close(self) -> None:
        """Take no more shards (another plan waits, or the worker drains)."""
        self.closed = True

    def holds(self, index: int) -> bool:
        return index in self._taken

    def adopt(self, tasks: list[_ShardTask]) -> None:
        """Hold ``tasks`` as if taken (the run failed before it took them: they fail with it)."""
        self._taken.update({t.shard.index: t for t in tasks})

    def finish(self, index: int) -> _ShardTask | None:
        """The open task of shard ``index``, no longer held (None: not this run's)."""
        return self._taken.pop(index, None)

    def open_tasks(self) -> list[_ShardTask]:
        return list(self._taken.values())

    def release(self) -> None:
        """Hold nothing any more (every open task was answered)."""
        self._taken.clear()

    def notify(self, progress: ShardOutcome) -> None:
        if self.handing_back and progress.state == ShardState.CANCELLED:
            return  # not cancelled: handed back, and the task reports that itself
        task = self._taken.get(progress.index)
        if task is not None and task.on_progress is not None:
            task.on_progress(progress)

    def should_stop(self) -> bool:
        """The job's cancel flag, asked through any of its shard tasks that can (a task started
        while the state store was unreachable has no check of its own); or the grace period of a
        shutdown has run out."""
        if self.thread.hand_back_due():
            self.handing_back = True
            return True
        checks = [t.should_stop for t in self._taken.values() if t.should_stop is not None]
        return bool(checks) and checks[0]()


class EngineThread:
    """``EngineThread().run_shard(plan, shard, ...)`` blocks until that shard's ShardOutcome is ready.

    ``cross_shard=False`` gives the old behaviour (drain between shards), for benchmarks.
    """

    def __init__(self, *, cross_shard: bool = True) -> None:
        self.cross_shard = cross_shard
        self._queue: deque[_ShardTask] = deque()
        self._calls: deque[tuple[Callable[[], Any], Future]] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._hand_back_at: float | None = None  # set by drain()

    @property
    def draining(self) -> bool:
        return self._hand_back_at is not None

    def hand_back_due(self) -> bool:
        return self._hand_back_at is not None and time.monotonic() >= self._hand_back_at

    def take_task(self, feed: _PlanFeed, wait: bool) -> _ShardTask | None:
        """The next queued shard for ``feed``'s run; with ``wait``, waits a moment for one."""
        with self._cond:
            task = self._take(feed)
            if task is None and wait and not feed.closed:
                self._cond.wait(IDLE_WAIT_S)
                task = self._take(feed)
        return task

    def _take(self, feed: _PlanFeed) -> _ShardTask | None:
        """The first queued shard of the feed's plan; none once another plan waits (it goes next),
        and then the feed is closed. A shard whose index is already open in the feed (a
        redelivered duplicate) waits until the first copy is written, and is then found
        current and skipped."""
        if self.draining:
            feed.close()
        if feed.closed:
            return None
        for task in self._queue:
            if task.plan_key != feed.key:
                feed.close()
                return None
            if not feed.holds(task.shard.index):
                self._queue.remove(task)
                return task
        return None

    def drain(self, grace_s: float) -> None:
        """Shutting down: take no new shards, hand back the queued ones now, and the open ones
        if they are not finished within ``grace_s`` seconds."""
        with self._cond:
            if self._hand_back_at is None or grace_s < self._hand_back_at - time.monotonic():
                self._hand_back_at = time.monotonic() + max(0.0, grace_s)
            queued, self._queue = list(self._queue), deque()
            self._cond.notify_all()
        for task in queued:
            task.future.set_exception(ShardHandedBack(f"shard {task.shard.index}: worker shutting down, not started"))
        log.warning("shutting down: %d queued shard(s) handed back; open shards get %.0f s to finish",
                    len(queued), grace_s)

    def submit(
        self,
        plan: JobPlan,
        shard: ShardRef,
        *,
        on_progress: ProgressCallback | None = None,
        should_stop: Callable[[], bool] | None = None,
        worker: str | None = None,
    ) -> Future:
        """Queue a shard; the future resolves to its ShardOutcome (it never raises for a bad shard)."""
        future: Future = Future()
        task = _ShardTask(plan, plan_key(plan), shard, on_progress, should_stop, worker or "", future)
        with self._cond:
            if self.draining:
                future.set_exception(ShardHandedBack(f"shard {shard.index}: worker shutting down, not started"))
                return future
            self._queue.append(task)
            self._cond.notify_all()
        return future

    def run_shard(self, plan: JobPlan, shard: ShardRef, **kwargs: Any) -> ShardOutcome:
        """Queue a shard and wait for its outcome (see ``submit``)."""
        future = self.submit(plan, shard, **kwargs)
        self.start()
        return future.result()

    def preload(self, settings: dict[str, Any]) -> None:
        """Build and warm the engine on the engine thread (where it will run) and wait for it."""
        future: Future = Future()
        with self._cond:
            self._calls.append((lambda: get_engine(settings), future))
            self._cond.notify_all()
        self.start()
        future.result()

    def start(self) -> None:
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="tokenmill-engine", daemon=True)
                self._thread.start()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._calls:
                    self._cond.wait()
                call = self._calls.popleft() if self._calls else None
                first = self._queue[0] if call is None else None
            if call is not None:
                fn, future = call
                try:
                    future.set_result(fn())
                except BaseException as exc:
                    future.set_exception(exc)
                continue
            self._run_plan(first)

    def _run_plan(self, first: _ShardTask) -> None:
        """One driver run over every queued shard of ``first``'s plan, until another plan waits."""
        feed = _PlanFeed(self, first.plan_key)
        settings = first.plan.engine_settings
        try:
            driver = ShardDriver(
                get_engine(settings), first.plan, cross_shard=self.cross_shard, on_progress=feed.notify,
                should_stop=feed.should_stop, engine_factory=lambda: rebuild_engine(settings),
                worker=first.worker or None, on_step=step_observer(first.plan),
                hand_back=lambda: feed.handing_back,
            )
            for outcome in driver.run(feed):
                task = feed.finish(outcome.index)
                if task is None:
                    continue
                if feed.handing_back and outcome.state == ShardState.CANCELLED:
                    task.future.set_exception(ShardHandedBack(
                        f"shard {task.shard.index}: worker shutting down, not finished within the grace period"
                        f" ({outcome.reason})"))
                else:
                    task.future.set_result(outcome)
        except BaseException as exc:  # a bug, an engine that cannot be built, a hook calling sys.exit:
            # fail these shards and keep serving; a dead engine thread would leave every task waiting
            log.exception("engine thread run failed")
            reason = f"cannot process: {type(exc).__name__}: {exc}"
            with self._cond:
                if not feed.open_tasks():  # never got going: the first shard (and its plan's queue) fails
                    stranded = [t for t in self._queue if t.plan_key == first.plan_key]
                    for t in stranded:
                        self._queue.remove(t)
                    feed.adopt(stranded)
            for task in feed.open_tasks():
                with contextlib.suppress(Exception):  # the shard's state must not stay "running"
                    feed.notify(ShardOutcome(task.shard.index, task.shard.url, ShardState.FAILED, reason=reason))
                task.future.set_result(
                    ShardOutcome(task.shard.index, task.shard.url, ShardState.FAILED, reason=reason, worker=task.worker)
                )
            feed.release()


_engine_thread: EngineThread | None = None
_engine_thread_lock = threading.Lock()


def engine_thread() -> EngineThread:
    """This process's engine thread (one engine, one thread)."""
    global _engine_thread
    with _engine_thread_lock:
        if _engine_thread is None:
            _engine_thread = EngineThread()
        return _engine_thread
