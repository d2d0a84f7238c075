"""pytest fixtures for a loopback S3 server; imported by tests/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from s3_server import S3Server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One moto server for the whole session; tests isolate themselves with fresh buckets."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        server = S3Server()
        server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A fresh, empty bucket name on the session server."""
    if not s3_server.running:  # a fault test may have left it stopped
        s3_server.start()
    return s3_server.make_bucket()
