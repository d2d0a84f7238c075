"""A run's hold on its output: the lease (``connectors.lease``) and its heartbeat.

An embedded run holds the lease for its whole run, renewed by a background thread; a fleet
job takes it at submit, its shard tasks renew it as they run, and its finalizer checks it
before writing the manifest and ``_SUCCESS`` and releases it after. A shard task or a
finalizer that finds no lease at all (a late redelivery after its job's finalizer released
it) goes on: a shard writes only its own part, and a finalizer takes the lease for the time
it publishes. Either is refused while another run holds the output.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from connectors import OutputLeased, acquire_lease, read_lease, release_lease, renew_lease
from pipeline.plan import JobPlan

log = logging.getLogger(__name__)

HEARTBEATS_PER_TTL = 4
# A fleet job's shards may wait in the queue behind other jobs: its heartbeats come only
# from running shards, so it is taken for dead only after a longer silence.
FLEET_TTL_S = 3600.0
EMBEDDED_TTL_S = 120.0


def holder(mode: str) -> str:
    return f"{mode} on {socket.gethostname()} pid {os.getpid()}"


def take_output(plan: JobPlan, mode: str, ttl_s: float, *, this_process: bool = True) -> None:
    """Take the output for ``plan.job_id``; ``OutputLeased`` names the run holding it.
    ``this_process``: the run lives in this process, so the lease names its pid (a fleet job's
    does not: its submitter exits at once)."""
    acquire_lease(plan.output_url, plan.job_id, holder(mode), plan.output_options, ttl_s=ttl_s,
                  this_process=this_process)


def renew_output(plan: JobPlan) -> bool:
    """A heartbeat for ``plan.job_id``; False if no run holds the output, ``OutputLeased`` if
    another run does (it took the output over)."""
    held = read_lease(plan.output_url, plan.output_options)
    if held is None:
        return False
    if held.run_id != plan.job_id:
        raise OutputLeased(plan.output_url, held, time.time())
    renew_lease(plan.output_url, plan.job_id, plan.output_options)
    return True


def hold_to_publish(plan: JobPlan) -> bool:
    """Before the manifest: ``OutputLeased`` unless ``plan.job_id`` holds the output, taking it
    if no run does. Returns whether it was taken here (the caller releases it then)."""
    held = read_lease(plan.output_url, plan.output_options)
    if held is not None and held.run_id == plan.job_id:
        return False
    take_output(plan, "finalizer", EMBEDDED_TTL_S)
    return True


def release_output(plan: JobPlan) -> None:
    try:
        release_lease(plan.output_url, plan.job_id, plan.output_options)
    except Exception as exc:  # the lease goes stale by itself
        log.warning("cannot release the lease on %s: %s", plan.output_url, exc)


@contextmanager
def holding_output(plan: JobPlan, mode: str = "embedded run", ttl_s: float = EMBEDDED_TTL_S) -> Iterator[None]:
    """Hold the output while the block runs: take it, renew it every ``ttl_s / 4`` from a
    thread, release it at the end (a run that dies leaves it to go stale)."""
    take_output(plan, mode, ttl_s)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(ttl_s / HEARTBEATS_PER_TTL):
            try:
                renew_output(plan)
            except OutputLeased as exc:
                log.error("%s: run %s lost its output", exc, plan.job_id)
                return
            except Exception as exc:  # a missed heartbeat; the next one may pass
                log.warning("cannot renew the lease on %s: %s", plan.output_url, exc)

    thread = threading.Thread(target=beat, name=f"lease-{plan.job_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
        release_output(plan)


def heartbeat_every(plan: JobPlan, seconds: float) -> Callable[[], None]:
    """A function that renews the lease at most every ``seconds`` (for a fleet shard's progress)."""
    last = [0.0]

    def maybe() -> None:
        now = time.monotonic()
        if now - last[0] >= seconds:
            last[0] = now
            renew_output(plan)

    return maybe
