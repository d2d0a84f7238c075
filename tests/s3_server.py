"""A real S3 endpoint on loopback for tests: moto's server as a child process.

moto's in-process `mock_aws` does not intercept s3fs (aiobotocore), so tests talk to a
genuine HTTP server in its own process, started and stopped by PID on a port below 32768.
An outage is ``pause()``: the process is frozen with SIGSTOP (requests hang, as on a server
that stopped answering) and ``resume()`` thaws it with its buckets intact. ``stop()`` kills
it; moto keeps nothing on disk, so a server started again is empty.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from typing import Any

_ACCESS_KEY = "testing"
_SECRET_KEY = "testing"
_REGION = "us-east-1"


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A free loopback port below 32768, away from the kernel's ephemeral range."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    if port < 32768:
        return port
    for _ in range(200):
        port = random.randint(20000, 32000)
        if _port_is_free(port):
            return port
    raise RuntimeError("no free port in 20000-32000")


def _wait_for_port(port: int, *, up: bool, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                is_up = True
        except OSError:
            is_up = False
        if is_up == up:
            return
        time.sleep(0.05)
    raise RuntimeError(f"port {port} did not come {'up' if up else 'down'} within {timeout}s")


class S3Server:
    """moto S3 on 127.0.0.1:<port> in a child process."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """s3fs options for this server; a fresh dict each time so callers may mutate it."""
        return {
            "key": _ACCESS_KEY,
            "secret": _SECRET_KEY,
            "client_kwargs": {"endpoint_url": self.endpoint_url},
        }

    @staticmethod
    def set_env() -> None:
        """botocore needs a region and credentials even for a fake endpoint."""
        os.environ["AWS_DEFAULT_REGION"] = _REGION
        os.environ["AWS_ACCESS_KEY_ID"] = _ACCESS_KEY
        os.environ["AWS_SECRET_ACCESS_KEY"] = _SECRET_KEY

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        if self.running:
            return
        self.set_env()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        _wait_for_port(self.port, up=True, timeout=60)

    def stop(self) -> None:
        if not self.running:
            return
        proc, self.proc = self.proc, None
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        _wait_for_port(self.port, up=False)

    def pause(self) -> None:
        """Freeze the server: connections are accepted by the kernel but never answered."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def client(self) -> Any:
        """A plain boto3 S3 client, for test setup that should bypass the code under test."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=_ACCESS_KEY,
            aws_secret_access_key=_SECRET_KEY,
            region_name=_REGION,
        )

    def make_bucket(self, name: str | None = None) -> str:
        """Create a bucket (random name if none given) and return its name."""
        name = name or f"tm-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def __enter__(self) -> S3Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
