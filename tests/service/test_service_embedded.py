"""``tokenmill serve`` without a broker: batches run in the server process (embedded runner), and
batch and file metadata, kept in the storage, survive a restart of the server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import httpx2 as httpx
import openai
from pipeline_support import tiny_engine
from service_stack import MODEL_NAME, REPO, Proc, chat_line, free_port, jsonl, wait_for


def _serve(tmp_path, model_dir, port: int, key: str, log_name: str) -> Proc:
    engine = {k: v for k, v in tiny_engine(model_dir).items() if k != "model"}
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENMILL_API_KEYS": key}
    log = tmp_path / log_name
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", "--storage", str(tmp_path / "storage"), "--port", str(port),
         "--model", str(model_dir), "--served-model-name", MODEL_NAME, "--engine-options", json.dumps(engine),
         "--max-tokens", "8"],
        cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    server = Proc(proc, log)

    def up() -> bool:
        server.check()
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).json()["mode"] == "embedded"
        except httpx.HTTPError:
            return False

    wait_for(up, 120, "the embedded server")
    return server


def test_embedded_batch_completes_and_survives_a_server_restart(tmp_path, tiny_model_dir):
    port, key = free_port(), "embedded-key"
    server = _serve(tmp_path, tiny_model_dir, port, key, "server-1.log")
    c = openai.OpenAI(api_key=key, base_url=f"http://127.0.0.1:{port}/v1", max_retries=0, timeout=30)
    try:
        ids = [f"e-{i}" for i in range(5)]
        upload = c.files.create(file=("in.jsonl", jsonl([chat_line(i, f"Hello number {i}") for i in ids])),
                                purpose="batch")
        batch = c.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")

        def finished():
            server.check()
            b = c.batches.retrieve(batch.id)
            return b if b.status in ("completed", "failed") else None

        done = wait_for(finished, 180, "the embedded batch", interval=0.3)
        assert done.status == "completed", done.errors
        assert (done.request_counts.completed, done.request_counts.failed) == (5, 0) and done.error_file_id is None
        output = c.files.content(done.output_file_id).text
        assert Counter(json.loads(x)["custom_id"] for x in output.splitlines()) == Counter(ids)
    finally:
        server.stop()

    server = _serve(tmp_path, tiny_model_dir, port, key, "server-2.log")
    try:
        again = c.batches.retrieve(batch.id)
        assert again.model_dump() == done.model_dump()
        assert c.files.content(done.output_file_id).text == output
        assert [b.id for b in c.batches.list().data] == [batch.id]
    finally:
        server.stop()
