"""The Celery fleet for tests: worker subprocesses on a broker, each run on its own queue
and Redis key prefix (tests/system/test_celery_fleet.py explains why); shared by the system
tests and the harness's fleet tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from pipeline_support import tiny_engine, wait_until

from pipeline.fleet import submit_job

REPO = Path(__file__).resolve().parents[1]
REDIS_BROKER = "redis://127.0.0.1:6379/0"
RESULT_BACKEND = "redis://127.0.0.1:6379/1"
RABBIT_BROKER = "amqp://guest:guest@127.0.0.1:5672//"
WORKER_START_TIMEOUT = 180
JOB_TIMEOUT = 300


def _require(port: int, what: str) -> None:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        message = f"{what} is not reachable on 127.0.0.1:{port}"
        if os.environ.get("CI"):
            pytest.fail(message)  # never silently skipped in CI
        pytest.skip(message)



@dataclass
class Worker:
    proc: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"worker exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
        return " ready." in self.log.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


@dataclass
class Fleet:
    broker_url: str
    queue: str
    env: dict[str, str]
    logdir: Path
    pool: str = "solo"
    workers: list[Worker] = field(default_factory=list)

    def start(self, count: int) -> None:
        new = []
        for _ in range(count):
            log = self.logdir / f"worker-{len(self.workers) + len(new)}.log"
            proc = subprocess.Popen(
                [sys.executable, "-m", "cli", "worker", "--queues", self.queue, "--pool", self.pool,
                 "--loglevel", "INFO"],
                cwd=REPO, env=self.env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
            )
            new.append(Worker(proc, log))
        self.workers += new
        for w in new:
            wait_until(w.ready, WORKER_START_TIMEOUT, f"worker {w.pid} ready")

    def alive(self) -> list[Worker]:
        return [w for w in self.workers if w.proc.poll() is None]

    def ensure(self, count: int) -> None:
        missing = count - len(self.alive())
        if missing > 0:
            self.start(missing)

    def by_pid(self, pid: int) -> Worker:
        return next(w for w in self.workers if w.pid == pid)

    def logs(self) -> str:
        return "\n".join(f"--- {w.log.name} (pid {w.pid})\n{w.log.read_text()[-4000:]}" for w in self.workers)

    def stop(self) -> None:
        for w in self.workers:
            try:
                w.kill()
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass

    @contextlib.contextmanager
    def own_settings(self) -> Iterator[None]:
        """The fleet's Redis key prefix in the process environment, which client apps read when
        built: another module fixture (the other broker's fleet) may have set its own."""
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("TOKENMILL_REDIS_KEY_PREFIX", self.env["TOKENMILL_REDIS_KEY_PREFIX"])
            yield

    def client(self):
        """A Celery app that publishes to this fleet."""
        from pipeline.celery_app import make_app

        with self.own_settings():
            return make_app(self.broker_url, RESULT_BACKEND, self.queue)

    def submit(self, plan) -> str:
        return submit_job(plan, self.broker_url, result_backend=RESULT_BACKEND, queue=self.queue,
                          redis_key_prefix=self.env["TOKENMILL_REDIS_KEY_PREFIX"])


def _fleet_env(broker_url: str, queue: str, prefix: str, extra: dict[str, str]) -> dict[str, str]:
    return {
        "TOKENMILL_BROKER_URL": broker_url,
        "TOKENMILL_RESULT_BACKEND": RESULT_BACKEND,
        "TOKENMILL_QUEUE": queue,
        "TOKENMILL_REDIS_KEY_PREFIX": prefix,
        "TOKENMILL_VISIBILITY_TIMEOUT": "30",  # above the longest shard here (about 10 s on a loaded box)
        "TOKENMILL_RESTORE_INTERVAL": "1",  # sweep for expired unacked messages every second
        "TOKENMILL_RESTORE_THROTTLE": "1",
        # a worker killed (or frozen) mid-sweep holds the sweep lock until it expires
        "TOKENMILL_RESTORE_MUTEX_EXPIRE": "5",
        **extra,
    }


def _make_fleet(
    broker_url: str, tmp_path_factory, model_dir: Path, extra: dict[str, str], pool: str = "solo"
) -> Iterator[Fleet]:
    run = uuid.uuid4().hex[:10]
    queue, prefix = f"tm-test-{run}", f"tm-test-{run}:"
    # workers build and warm the engine before reporting ready, so no shard pays for it
    preload = {"TOKENMILL_PRELOAD_ENGINE": json.dumps(tiny_engine(model_dir))}
    fleet_env = _fleet_env(broker_url, queue, prefix, {**preload, **extra})
    fleet = Fleet(broker_url, queue, {**os.environ, **fleet_env}, tmp_path_factory.mktemp(f"fleet-{run}"), pool)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in fleet_env.items():  # the test process submits and polls with the same settings
            mp.setenv(key, value)
        try:
            yield fleet
        finally:
            fleet.stop()
            r = redis.Redis.from_url(REDIS_BROKER)
            for key in r.scan_iter(f"{prefix}*"):
                r.delete(key)
            if broker_url.startswith("amqp"):
                from kombu import Connection

                with Connection(broker_url) as conn:
                    channel = conn.channel()
                    channel.queue_delete(queue)
                    channel.exchange_delete(queue)


