"""A real S3 endpoint on loopback (moto's threaded server) for tests.

moto's in-process `mock_aws` does not intercept s3fs (aiobotocore), so tests talk
to a genuine HTTP server instead. The server can be stopped and started again on
the same port to simulate an outage; moto keeps its state in-process, so buckets
and objects survive a restart.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
import uuid
from typing import Any

from moto.server import ThreadedMotoServer

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
    """moto S3 on 127.0.0.1:<port>, restartable on the same port."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self._server: ThreadedMotoServer | None = None

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
        return self._server is not None

    def start(self) -> None:
        if self._server is not None:
            return
        self.set_env()
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        server.start()
        self._server = server
        _wait_for_port(self.port, up=True)

    def stop(self) -> None:
        if self._server is None:
            return
        server, self._server = self._server, None
        server.stop()
        # ThreadedMotoServer.stop() leaves the listening socket open; close it so
        # start() can bind the same port again and clients see "connection refused".
        wsgi = getattr(server, "_server", None)
        if wsgi is not None:
            wsgi.server_close()
        _wait_for_port(self.port, up=False)

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
