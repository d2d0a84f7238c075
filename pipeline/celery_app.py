"""The Celery app of the tokenmill fleet, configured from the environment.

``tokenmill worker`` (or ``celery -A pipeline.celery_app worker --pool=threads -c 2``) starts
a worker. Settings:

- ``TOKENMILL_BROKER_URL``      default ``redis://127.0.0.1:6379/0``; ``amqp://...`` for RabbitMQ
- ``TOKENMILL_RESULT_BACKEND``  default ``redis://127.0.0.1:6379/1`` (chords need a real backend)
- ``TOKENMILL_QUEUE``           default ``tokenmill``
- ``TOKENMILL_VISIBILITY_TIMEOUT`` (Redis) seconds before an unacknowledged shard is handed to
  another worker; default 4 h. It must exceed the longest shard, or a shard still running is
  delivered twice (harmless for the output: parts are idempotent and the finalizer waits for
  every shard; but wasted work).
- ``TOKENMILL_RESTORE_INTERVAL`` / ``TOKENMILL_RESTORE_THROTTLE`` (Redis) kombu's
  ``unacked_restore_interval`` (seconds between sweeps for expired unacked messages, default
  10) and ``unacked_restore_throttle`` (scan on every Nth sweep, default 10): a dead worker's
  shard comes back after visibility_timeout + up to interval x throttle. Tests set both to 1.
- ``TOKENMILL_RESTORE_MUTEX_EXPIRE`` (Redis) kombu's ``unacked_mutex_expire``, default 300: the
  lock a sweep holds expires after this many seconds, so a worker killed while sweeping delays
  every other worker's sweep by up to this long. Tests set it to 5 (a frozen-then-killed worker
  once held it and the redelivery came 300 s late).
- ``TOKENMILL_REDIS_KEY_PREFIX`` (Redis) kombu ``global_keyprefix``, isolating a fleet (or a
  test) that shares a Redis database with others, including the ``unacked`` bookkeeping.
- ``TOKENMILL_GRACE_PERIOD`` seconds a worker told to stop (SIGTERM: spot reclaim, rolling
  deploy) gives the shards it holds to finish; default 30. Set it below the time your
  orchestrator waits before SIGKILL. See ``_drain_on_shutdown``.
- ``TOKENMILL_BROKER_HEARTBEAT`` AMQP heartbeat seconds, default 0 (off): a solo-pool worker
  runs the shard inside its event loop and cannot answer heartbeats meanwhile, so RabbitMQ
  would drop it mid-shard. A killed worker's socket still closes, and RabbitMQ redelivers
  its unacknowledged shard at once.

RabbitMQ caveat: RabbitMQ closes a channel whose delivery stays unacknowledged longer than
``consumer_timeout`` (default 30 min) and redelivers the message. Shards are acknowledged
only when done (``task_acks_late``), so set ``consumer_timeout`` above the longest shard
(``consumer_timeout = 14400000`` in rabbitmq.conf, or the ``consumer-timeout`` policy /
``x-consumer-timeout`` queue argument on RabbitMQ >= 3.12).

Messages are JSON only: a shard task carries the plan and the shard's URL, never
documents. A plan's ``storage_options`` never hold a credential (``submit_job`` refuses
one): workers take theirs from their own environment (``"${env:NAME}"`` references, AWS_*
variables, instance roles) or a named profile.
"""

from __future__ import annotations

import json
import logging
import os

from celery import Celery
from celery.signals import worker_process_init, worker_ready, worker_shutting_down

log = logging.getLogger(__name__)

DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/0"
DEFAULT_RESULT_BACKEND = "redis://127.0.0.1:6379/1"
DEFAULT_QUEUE = "tokenmill"
DEFAULT_VISIBILITY_TIMEOUT_S = 4 * 3600
DEFAULT_GRACE_PERIOD_S = 30


def _env_number(name: str) -> float | None:
    value = os.environ.get(name)
    if value in (None, ""):
        return None
    number = float(value)
    return int(number) if number.is_integer() else number


def redis_transport_options(key_prefix: str | None = None) -> dict[str, object]:
    """kombu's Redis transport options; ``key_prefix`` None means $TOKENMILL_REDIS_KEY_PREFIX."""
    options: dict[str, object] = {
        "visibility_timeout": _env_number("TOKENMILL_VISIBILITY_TIMEOUT") or DEFAULT_VISIBILITY_TIMEOUT_S,
    }
    for env, key in (
        ("TOKENMILL_RESTORE_INTERVAL", "unacked_restore_interval"),
        ("TOKENMILL_RESTORE_THROTTLE", "unacked_restore_throttle"),
        ("TOKENMILL_RESTORE_MUTEX_EXPIRE", "unacked_mutex_expire"),
    ):
        value = _env_number(env)
        if value is not None:
            options[key] = value
    prefix = key_prefix if key_prefix is not None else os.environ.get("TOKENMILL_REDIS_KEY_PREFIX")
    if prefix:
        options["global_keyprefix"] = prefix
    return options


def make_app(
    broker_url: str | None = None,
    result_backend: str | None = None,
    queue: str | None = None,
    redis_key_prefix: str | None = None,
) -> Celery:
    """A configured app; arguments override the environment (used by clients of other fleets)."""
    broker = broker_url or os.environ.get("TOKENMILL_BROKER_URL") or DEFAULT_BROKER_URL
    backend = result_backend or os.environ.get("TOKENMILL_RESULT_BACKEND") or DEFAULT_RESULT_BACKEND
    app = Celery("tokenmill", broker=broker, backend=backend, include=["pipeline.tasks"])
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        # A redelivered shard whose result is already SUCCESS in the backend is not run again.
        worker_deduplicate_successful_tasks=True,
        task_default_queue=queue or os.environ.get("TOKENMILL_QUEUE") or DEFAULT_QUEUE,
        broker_connection_retry_on_startup=True,
        broker_heartbeat=_env_number("TOKENMILL_BROKER_HEARTBEAT") or 0,
        result_expires=7 * 24 * 3600,
        # Task events for Celery's own monitoring (Flower, `celery events`): shard tasks are
        # seen when sent, received, started and finished.
        worker_send_task_events=True,
        task_send_sent_event=True,
    )
    if broker.startswith(("redis://", "rediss://", "redis+socket://")):
        app.conf.broker_transport_options = redis_transport_options(redis_key_prefix)
    return app


app = make_app()


@worker_process_init.connect
def _preload_engine(**_: object) -> None:
    """Build and warm the engine when the pool starts (after the fork for prefork children; in
    the worker process itself for the solo pool, which sends this signal too in Celery 5.7) if
    $TOKENMILL_PRELOAD_ENGINE holds settings (JSON EngineConfig fields). Otherwise the first
    task builds it. A shard whose plan has other settings replaces it."""
    settings = os.environ.get("TOKENMILL_PRELOAD_ENGINE")
    if settings:
        from pipeline.engine_cache import get_engine  # lazy: submit/status import this app, torch-free

        get_engine(json.loads(settings))


@worker_ready.connect
def _preload_engine_for_threads(sender: object = None, **_: object) -> None:
    """The threads pool sends no ``worker_process_init``: build the engine on the engine
    thread before the worker logs "ready" (shard tasks that arrive meanwhile wait for it)."""
    from celery.concurrency.thread import TaskPool as ThreadsPool

    settings = os.environ.get("TOKENMILL_PRELOAD_ENGINE")
    if settings and isinstance(getattr(sender, "pool", None), ThreadsPool):
        from pipeline.engine_thread import engine_thread  # lazy: as get_engine above

        engine_thread().preload(json.loads(settings))



def grace_period_s() -> float:
    value = _env_number("TOKENMILL_GRACE_PERIOD")
    return float(value) if value is not None else float(DEFAULT_GRACE_PERIOD_S)


@worker_shutting_down.connect
def _drain_on_shutdown(sig: str | None = None, how: str | None = None, **_: object) -> None:
    """SIGTERM is Celery's warm shutdown: the consumer stops taking messages and the pool waits
    for its tasks. Bound that wait: shards that do not finish within the grace period are
    handed back, and their tasks reject their messages with requeue, so the broker gives them
    to another worker now rather than after the visibility timeout (Redis) or never acking
    (RabbitMQ). A cold shutdown (SIGQUIT) hands everything back at once.

    Not Celery's soft shutdown (``worker_soft_shutdown_timeout``): under the threads pool its
    cancel step raises NotImplementedError (the pool cannot terminate one job) and the worker
    then waits for every task anyway (Celery 5.7); it also sleeps the whole timeout even
    when the tasks finish sooner."""
    from pipeline.engine_thread import engine_thread  # lazy: as get_engine above

    grace = 0.0 if how == "Cold" else grace_period_s()
    log.warning("worker shutting down (%s, %s): finishing held shards for up to %.0f s", sig, how, grace)
    engine_thread().drain(grace)
