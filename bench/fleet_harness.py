"""Real fleet workers for the fleet benches: start them, watch them, stop them.

Workers are ``tokenmill worker`` subprocesses on the local Redis, each with its own queue
and key prefix, so a bench never sees another run's messages. A sampler thread records,
once a second, each worker's resident memory (``/proc/PID/status``) and the broker's queue
depth (messages waiting and delivered-but-unacknowledged).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

REPO = Path(__file__).resolve().parent.parent
REDIS_URL = "redis://127.0.0.1:6379"


def rss_mib(pid: int, field_name: str = "VmRSS") -> float:
    """Resident memory of a process in MiB (VmHWM: its peak so far)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return 0.0


@dataclass
class Sample:
    t: float
    queued: int
    unacked: int
    rss_mib: list[float]
    shards_done: int


@dataclass
class FleetHarness:
    """``with FleetHarness(engine_settings, pool=...) as fleet: fleet.start(2); fleet.submit(plan)``."""

    engine_settings: dict[str, Any]
    pool: str = "threads"
    concurrency: int = 2
    extra_env: dict[str, str] = field(default_factory=dict)
    logdir: Path = field(default_factory=lambda: Path(os.environ.get("TMPDIR", "/tmp")))
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def queue(self) -> str:
        return f"tm-bench-{self.run}"

    @property
    def prefix(self) -> str:
        return f"tm-bench-{self.run}:"

    def env(self) -> dict[str, str]:
        return {
            "TOKENMILL_BROKER_URL": f"{REDIS_URL}/0",
            "TOKENMILL_RESULT_BACKEND": f"{REDIS_URL}/1",
            "TOKENMILL_QUEUE": self.queue,
            "TOKENMILL_REDIS_KEY_PREFIX": self.prefix,
            "TOKENMILL_PRELOAD_ENGINE": json.dumps(self.engine_settings),
            **self.extra_env,
        }

    def __enter__(self) -> FleetHarness:
        os.environ.update(self.env())  # this process submits and polls with the same settings
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, count: int, timeout: float = 600) -> None:
        env = {**os.environ, **self.env()}
        for _ in range(count):
            log = self.logdir / f"{self.queue}-worker-{len(self.procs)}.log"
            proc = subprocess.Popen(
                [sys.executable, "-m", "cli", "worker", "--queues", self.queue, "--pool", self.pool,
                 "--concurrency", str(self.concurrency), "--loglevel", "INFO"],
                cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
            )
            self.procs.append(proc)
            self.logs.append(log)
        deadline = time.monotonic() + timeout
        for proc, log in zip(self.procs, self.logs, strict=True):
            while b"ready." not in log.read_bytes():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"worker did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.5)

    def submit(self, plan) -> str:
        from pipeline.fleet import submit_job

        return submit_job(plan, f"{REDIS_URL}/0", result_backend=f"{REDIS_URL}/1", queue=self.queue)

    def sample_every(self, seconds: float, job_id: str) -> threading.Thread:
        """Record samples in the background until ``stop``."""
        from pipeline.fleet import job_status

        broker = redis.Redis.from_url(f"{REDIS_URL}/0")
        t0 = time.monotonic()

        def loop() -> None:
            while not self._stop.is_set():
                try:
                    queued = broker.llen(f"{self.prefix}{self.queue}")
                    unacked = broker.hlen(f"{self.prefix}unacked")
                    done = sum(s["state"] in ("done", "skipped", "failed") for s in job_status(job_id)["shards"])
                except redis.RedisError:
                    queued = unacked = done = -1
                self.samples.append(Sample(time.monotonic() - t0, queued, unacked,
                                           [rss_mib(p.pid) for p in self.procs], done))
                self._stop.wait(seconds)

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        return thread

    def peak_rss_mib(self) -> list[float]:
        return [rss_mib(p.pid, "VmHWM") for p in self.procs]

    def stop(self) -> None:
        self._stop.set()
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        r = redis.Redis.from_url(f"{REDIS_URL}/0")
        for key in r.scan_iter(f"{self.prefix}*"):
            r.delete(key)
