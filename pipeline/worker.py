"""Starting a fleet worker: ``python -m pipeline.worker [--queues q] [--pool solo] [-c 1]``.

The solo pool runs one shard at a time in the worker process itself, which keeps the
one engine (and its KV pool) in one place; scale out with more worker processes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import uuid
from typing import Any

from pipeline.celery_app import app


def worker_argv(
    queues: list[str] | None = None,
    concurrency: int = 1,
    pool: str = "solo",
    loglevel: str = "INFO",
    hostname: str | None = None,
) -> list[str]:
    queues = queues or [app.conf.task_default_queue]
    return [
        "worker",
        f"--pool={pool}",
        f"--concurrency={concurrency}",
        f"--loglevel={loglevel}",
        f"--queues={','.join(queues)}",
        f"--hostname={hostname or f'tokenmill-{uuid.uuid4().hex[:8]}@{socket.gethostname()}'}",
        # gossip/mingle/event heartbeats are for monitoring tools; they only add broker traffic here.
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]


def start_worker(
    queues: list[str] | None = None,
    concurrency: int = 1,
    pool: str = "solo",
    loglevel: str = "INFO",
    hostname: str | None = None,
    preload_engine: dict[str, Any] | None = None,
) -> None:
    """Run a worker in this process until it is stopped (blocks). Used by the CLI.

    ``preload_engine`` (EngineConfig fields; default: JSON in $TOKENMILL_PRELOAD_ENGINE) makes
    the pool build and warm the engine before the worker reports ready, so the first shard
    does not pay for loading and compilation (see ``pipeline.celery_app``).
    """
    if preload_engine is not None:
        os.environ["TOKENMILL_PRELOAD_ENGINE"] = json.dumps(preload_engine)
    app.worker_main(worker_argv(queues, concurrency, pool, loglevel, hostname))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Start a tokenmill fleet worker.")
    parser.add_argument("--queues", "-Q", default=None, help="comma-separated queue names")
    parser.add_argument("--concurrency", "-c", type=int, default=1)
    parser.add_argument("--pool", default=os.environ.get("TOKENMILL_POOL", "solo"))
    parser.add_argument("--loglevel", "-l", default="INFO")
    parser.add_argument("--hostname", "-n", default=None)
    args = parser.parse_args(argv)
    queues = args.queues.split(",") if args.queues else None
    start_worker(queues, args.concurrency, args.pool, args.loglevel, args.hostname)


if __name__ == "__main__":
    main()
