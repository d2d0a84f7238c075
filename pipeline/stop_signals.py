"""SIGTERM and SIGINT for the runs of this process: stop, checkpoint, exit 143 or 130.

A Kubernetes Job, a cron line or Airflow's BashOperator stops ``tokenmill run`` with SIGTERM
(and SIGKILL after a grace period); a person stops it with Ctrl-C. Without a handler the
process died at once and every finished row not yet in a part was lost. Now the first
signal asks each run of this process to stop (``stoppable_run``): the run stops admitting
rows, checkpoints every open shard's finished rows the way a draining fleet worker does
(``ShardDriver``'s ``hand_back``) and raises ``RunInterrupted``, a ``SystemExit`` whose code is
128 + the signal's number (143 for SIGTERM, 130 for SIGINT). With no run in progress (lm-eval
on its in-process engine, or between jobs) ``RunInterrupted`` is raised at once. A second
signal exits at once (``os._exit``): nothing more is saved, and the output's lease, whose
holder pid is then gone, is taken over by the next run on this host at once.

Python lets only the main thread install handlers: a run on another thread (the server's
embedded runner) keeps the process's own handling.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class RunInterrupted(SystemExit):
    """A run stopped by a signal; the exit code is 128 + the signal's number."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(128 + signum)
        self.signum, self.message = signum, message

    def __str__(self) -> str:
        return self.message


class StopRequest:
    """What a run polls: ``signum`` is set when a stop signal came."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""


_runs: list[StopRequest] = []
_saved: dict[int, object] = {}
_depth = 0
_received: int | None = None


def _handle(signum: int, frame: FrameType | None) -> None:
    global _received
    name = signal.Signals(signum).name
    if _received is not None:
        os.write(2, f"second {name}: exiting now\n".encode())
        os._exit(128 + signum)
    _received = signum
    if not _runs:
        raise RunInterrupted(signum, f"interrupted by {name}")
    log.warning("%s: stopping; the open shards' finished rows are checkpointed (send it again to exit at once)", name)
    for run in list(_runs):  # a copy: a run on another thread may end meanwhile
        run.signum = signum


@contextmanager
def handling_stop_signals() -> Iterator[None]:
    """SIGTERM and SIGINT handled as above for the block (main thread only; blocks nest)."""
    global _depth, _received
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _depth == 0:
        _received = None
        for s in STOP_SIGNALS:
            _saved[s] = signal.signal(s, _handle)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            for s, handler in _saved.items():  # None: set outside Python, not restorable
                signal.signal(s, signal.SIG_DFL if handler is None else handler)  # type: ignore[arg-type]
            _saved.clear()
            _received = None  # a run started later (on any thread) is not stopped by this signal


@contextmanager
def stoppable_run() -> Iterator[StopRequest]:
    """A run that a stop signal asks to stop: it polls the request and then raises
    ``request.interrupted(...)``."""
    request = StopRequest()
    with handling_stop_signals():
        request.signum = _received
        _runs.append(request)
        try:
            yield request
        finally:
            _runs.remove(request)


def interrupted(request: StopRequest, what: str) -> RunInterrupted:
    """The exception that ends a run stopped by ``request``'s signal."""
    assert request.signum is not None
    return RunInterrupted(request.signum, f"interrupted by {request.signal_name}: {what}")
