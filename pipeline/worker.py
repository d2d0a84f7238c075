"""Starting a fleet worker (``tokenmill worker``): Celery's argv for one engine per process.

Default: the ``threads`` pool with 2 task threads. Each thread holds one shard task and
waits while the process's engine thread (one thread, one engine, see
``pipeline.engine_thread``) processes it, so the next shard is already admitted while
the previous one's last requests decode. ``--pool solo`` runs one shard at a time (the
engine drains at each shard boundary). Scale out with more worker processes, not more
threads: the engine is the unit of compute.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from typing import Any

from pipeline.celery_app import app

DEFAULT_POOL = "threads"
DEFAULT_CONCURRENCY = 2  # shard tasks held at once: one tailing, one being admitted


def worker_argv(
    queues: list[str] | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    pool: str = DEFAULT_POOL,
    loglevel: str = "INFO",
    hostname: str | None = None,
) -> list[str]:
    queues = queues or [app.conf.task_default_queue]
    if pool not in ("threads", "solo"):
        raise ValueError(f"pool must be 'threads' or 'solo' (one engine per process), got {pool!r}")
    return [
        "worker",
        f"--pool={pool}",
        f"--concurrency={1 if pool == 'solo' else concurrency}",
        f"--loglevel={loglevel}",
        f"--queues={','.join(queues)}",
        f"--hostname={hostname or f'tokenmill-{uuid.uuid4().hex[:8]}@{socket.gethostname()}'}",
        # gossip and mingle (worker-to-worker sync) only add broker traffic here. Heartbeat events
        # stay on with the task events (pipeline.celery_app), so Flower and `celery events` list workers.
        "--without-gossip",
        "--without-mingle",
    ]


def start_worker(
    queues: list[str] | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    pool: str = DEFAULT_POOL,
    loglevel: str = "INFO",
    hostname: str | None = None,
    preload_engine: dict[str, Any] | None = None,
    grace_period: float | None = None,
) -> None:
    """Run a worker in this process until it is stopped (blocks). Used by the CLI.

    ``preload_engine`` (EngineConfig fields; default: JSON in $TOKENMILL_PRELOAD_ENGINE) makes
    the pool build and warm the engine before the worker reports ready, so the first shard
    does not pay for loading and compilation (see ``pipeline.celery_app``). ``grace_period``
    (default $TOKENMILL_GRACE_PERIOD, else 30 s): on SIGTERM, how long held shards may finish
    before they are handed back to the broker.
    """
    if grace_period is not None:
        os.environ["TOKENMILL_GRACE_PERIOD"] = str(grace_period)
    if preload_engine is not None:
        os.environ["TOKENMILL_PRELOAD_ENGINE"] = json.dumps(preload_engine)
    app.worker_main(worker_argv(queues, concurrency, pool, loglevel, hostname))
