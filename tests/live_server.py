"""An in-process ``tokenmill serve`` on a real socket (uvicorn on a thread) with the tiny model, for
the live routes' tests: streaming needs a real connection to close, and the tests look at the
app's live engine directly."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from pipeline_support import tiny_engine, wait_until
from service_stack import MODEL_NAME, free_port
from tenant_support import RecordingRunner

from service.app import create_app
from service.settings import ServiceSettings


@dataclass
class LiveServer:
    url: str
    app: Any
    key: str

    @property
    def live(self) -> Any:
        return self.app.state.live_engine


@contextmanager
def live_server(tmp_path: Path, model_dir: Path, key: str, embedded: bool = False,
                **engine: Any) -> Iterator[LiveServer]:
    """``embedded``: the server's own runner runs the jobs (on the live routes' engine), not a recorder."""
    options = {k: v for k, v in tiny_engine(model_dir, **engine).items() if k != "model"}
    settings = ServiceSettings(storage_url=str(tmp_path / "storage"), api_keys=[key], model=str(model_dir),
                               served_model_name=MODEL_NAME, engine_options=options, default_max_tokens=8)
    app = create_app(settings, None if embedded else RecordingRunner(), load_model=True)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="live-server", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 60, "the in-process server")
        yield LiveServer(f"http://127.0.0.1:{port}", app, key)
    finally:
        server.should_exit = True
        thread.join(30)
