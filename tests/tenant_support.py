"""An in-process ``tokenmill serve`` app for the hostile-key tests: real routes, store and limits,
and a runner that records what it was asked to run instead of queueing it."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from pipeline.plan import JobPlan
from service.app import create_app
from service.settings import ServiceSettings

CANARY = "s3cr3t-canary-4711"
KEY_A, KEY_B = "key-a-tenant", "key-b-tenant"


@dataclass
class RecordingRunner:
    """Keeps each submitted plan; every job reads as queued until ``finish`` is called."""

    plans: dict[str, JobPlan] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)

    def submit(self, plan: JobPlan) -> str:
        self.plans[plan.job_id] = plan
        self.states[plan.job_id] = "queued"
        return plan.job_id

    def status(self, job_id: str) -> dict[str, Any]:
        if job_id not in self.states:
            raise KeyError(f"unknown job {job_id!r}")
        return {"status": self.states[job_id], "shards": [], "progress": {"rows_done": 0, "errors": 0}}

    def cancel(self, job_id: str) -> None:
        if job_id not in self.states:
            raise KeyError(f"unknown job {job_id!r}")
        self.states[job_id] = "cancelled"


def settings_for(tmp_path: Path, **values: Any) -> ServiceSettings:
    values.setdefault("storage_url", str(tmp_path / "storage"))
    values.setdefault("model", "smollm2-135m-instruct")
    values.setdefault("api_keys", [KEY_A, KEY_B])
    return ServiceSettings(served_model_name="tiny-test", **values)


def client(settings: ServiceSettings, runner: Any | None = None) -> TestClient:
    app = create_app(settings, runner or RecordingRunner())
    return TestClient(app, raise_server_exceptions=False)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def spec(input_url: str, output_url: str, **sections: Any) -> dict[str, Any]:
    return {"name": "tenant-job", "kind": "summarize", "input": {"url": input_url, **sections.pop("input", {})},
            "output": {"url": output_url, **sections.pop("output", {})}, **sections}


def asgi_call(app: Any, method: str, path: str, headers: dict[str, str], chunks: list[bytes]) -> tuple[int, int]:
    """Call the ASGI app directly: (status, how many body chunks it pulled from ``receive``)."""
    pulled = 0
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        if pulled < len(chunks):
            pulled += 1
            return {"type": "http.request", "body": chunks[pulled - 1], "more_body": pulled < len(chunks)}
        await asyncio.sleep(3600)  # a client that never finishes its body
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 30))
    return status, pulled


def dumps(data: Any) -> bytes:
    return json.dumps(data).encode()
