"""Is anyone listening? The workers that consume a queue, asked at submit time.

A job submitted to a queue no live worker reads waits there silently (a typo in
``--queue``, or workers started with other ``--queues``), and its lease refuses the
corrected resubmit. ``submit`` asks the workers over the broker's broadcast
(``inspect().active_queues()``) for ``TOKENMILL_QUEUE_CHECK_S`` seconds (default 0.5, ``0``
skips it) and warns when none consumes the job's queue. It warns, not refuses: workers
may be starting (an autoscaler adds them when the queue grows), and a busy worker may answer late.
"""

from __future__ import annotations

import logging
import os

from celery import Celery

log = logging.getLogger(__name__)

DEFAULT_CHECK_S = 0.5


def check_seconds() -> float:
    try:
        return float(os.environ.get("TOKENMILL_QUEUE_CHECK_S", DEFAULT_CHECK_S))
    except ValueError:
        return DEFAULT_CHECK_S


def queue_consumers(app: Celery, queue: str, timeout_s: float) -> list[str] | None:
    """The workers that answered as consumers of ``queue``; None if the broker could not be asked."""
    try:
        replies = app.control.inspect(timeout=timeout_s).active_queues() or {}
    except Exception as exc:  # the job is queued all the same
        log.info("cannot ask the workers which queues they read: %s", exc)
        return None
    return sorted(w for w, queues in replies.items() if any(q.get("name") == queue for q in queues or ()))


def warn_if_unconsumed(app: Celery, queue: str, job_id: str) -> bool:
    """Log a warning (and return True) when no live worker consumes ``queue``."""
    timeout_s = check_seconds()
    if timeout_s <= 0:
        return False
    consumers = queue_consumers(app, queue, timeout_s)
    if consumers != []:
        return False
    log.warning("no live worker consumes queue %r (none answered within %g s): job %s waits until one does; "
                "`tokenmill cancel %s` ends it and releases its output", queue, timeout_s, job_id, job_id)
    return True
