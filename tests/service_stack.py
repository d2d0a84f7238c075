"""A real ``tokenmill serve`` and ``tokenmill worker`` on the local Redis, for the service tests.

Both are subprocesses started the way a user starts them; the fleet gets its own queue and
Redis key prefix (see test_celery_fleet.py) and the tiny random-weight model, preloaded.
"""

from __future__ import annotations

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

import httpx2 as httpx  # the HTTP client the openai package ships with
import pytest
import redis
from pipeline_support import tiny_engine
from pipeline_support import wait_until as wait_for

REPO = Path(__file__).resolve().parent.parent
REDIS_BROKER = "redis://127.0.0.1:6379/0"
RESULT_BACKEND = "redis://127.0.0.1:6379/1"
MODEL_NAME = "tiny-test"
START_TIMEOUT = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]



@dataclass
class Proc:
    proc: subprocess.Popen
    log: Path

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.log.name} exited with {self.proc.returncode}:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)


@dataclass
class Stack:
    url: str  # the server
    metrics_url: str  # the worker's /metrics
    keys: tuple[str, str]
    storage: Path
    worker: Proc
    server: Proc
    prefix: str
    queue: str
    model_label: str  # the model label of the worker's metrics

    server_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def healthy(self) -> bool:
        self.server.check()
        try:
            return httpx.get(self.url + "/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def restart_server(self) -> None:
        """Stop the server (SIGTERM) and start it again on the same port and storage."""
        self.server.stop()
        self.server = _start(self.server_args, self.env, self.server.log.with_suffix(".restarted.log"))
        wait_for(self.healthy, START_TIMEOUT, "the restarted server")

    def http(self, key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


def _start(args: list[str], env: dict[str, str], log: Path) -> Proc:
    proc = subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=REPO, env=env, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    return Proc(proc, log)


def start_stack(tmp: Path, model_dir: Path) -> Iterator[Stack]:
    run = uuid.uuid4().hex[:10]
    queue, prefix = f"tm-service-{run}", f"tm-service-{run}:"
    keys = (f"key-a-{run}", f"key-b-{run}")
    engine = tiny_engine(model_dir)
    env = {
        **os.environ, "PYTHONPATH": str(REPO), "TOKENMILL_BROKER_URL": REDIS_BROKER,
        "TOKENMILL_RESULT_BACKEND": RESULT_BACKEND, "TOKENMILL_QUEUE": queue, "TOKENMILL_REDIS_KEY_PREFIX": prefix,
        "TOKENMILL_PRELOAD_ENGINE": json.dumps(engine), "TOKENMILL_API_KEYS": ",".join(keys),
    }
    port, metrics_port = free_port(), free_port()
    storage = tmp / "storage"
    worker = _start(["worker", "--queues", queue, "--pool", "threads", "--metrics-port", str(metrics_port),
                     "--metrics-host", "127.0.0.1"], env, tmp / "worker.log")
    server_args = ["serve", "--broker", REDIS_BROKER, "--storage", str(storage), "--port", str(port),
                   "--model", str(model_dir), "--served-model-name", MODEL_NAME,
                   "--engine-options", json.dumps({k: v for k, v in engine.items() if k != "model"}),
                   "--max-tokens", "8", "--max-upload-mb", "1",
                   "--allowed-url-prefix", str(tmp.parent)]  # the tests' own folders, local paths
    server = _start(server_args, env, tmp / "server.log")
    stack = Stack(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics", keys, storage,
                  worker, server, prefix, queue, model_dir.name, server_args, env)
    try:
        def ready() -> bool:
            worker.check()
            return " ready." in worker.log.read_text() and stack.healthy()

        wait_for(ready, START_TIMEOUT, "worker and server")
        yield stack
    finally:
        stack.server.stop()
        worker.stop()
        r = redis.Redis.from_url(REDIS_BROKER)
        for key in r.scan_iter(f"{prefix}*"):
            r.delete(key)


@pytest.fixture(scope="session")
def service_stack(tmp_path_factory, tiny_model_dir) -> Iterator[Stack]:
    """One server and one worker for every service test of the session (started on first use)."""
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", 6379)) != 0:
            pytest.fail("Redis is not reachable on 127.0.0.1:6379") if os.environ.get("CI") else pytest.skip(
                "Redis is not reachable on 127.0.0.1:6379")
    yield from start_stack(tmp_path_factory.mktemp("service"), tiny_model_dir)


def chat_line(custom_id: str, text: str, max_tokens: int = 8, model: str = MODEL_NAME) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                     "temperature": 0}}


def jsonl(lines: list[dict]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def scrape(url: str) -> dict[str, float]:
    """Prometheus text format as {'name{labels}': value} (comment lines skipped)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out
