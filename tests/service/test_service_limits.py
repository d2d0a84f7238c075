"""Authentication before the body, body limits while streaming, uploads off the event loop and
the 50,000-line cap of a batch file (issue 23, point 3)."""

from __future__ import annotations

import json
import threading

import httpx2 as httpx
import pytest
import uvicorn
from service_stack import free_port, wait_for
from tenant_support import KEY_A, RecordingRunner, asgi_call, auth, client, dumps, settings_for, spec

from service.app import create_app

ROUTES = [("POST", "/v1/files"), ("POST", "/v1/batches"), ("POST", "/v1/jobs"), ("POST", "/v1/batches/b/cancel")]
MIB = 1024 * 1024


def _multipart(data: bytes, boundary: str = "tmboundary") -> bytes:
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n"
            "Content-Type: application/jsonl\r\n\r\n")
    return head.encode() + data + f"\r\n--{boundary}--\r\n".encode()


def _line(i: int) -> dict:
    return {"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions", "body": {"model": "tiny-test",
                                                                                       "prompt": "hi"}}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer not-a-key"}, {"Authorization": "Basic a2E="}],
                         ids=["no-key", "wrong-key", "not-bearer"])
@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_a_request_without_a_valid_key_gets_401_before_its_body_is_read(tmp_path, headers, method, path):
    app = create_app(settings_for(tmp_path), RecordingRunner())
    body = _multipart(b"x" * 1000) if path == "/v1/files" else dumps({"input_file_id": "f"})
    status, pulled = asgi_call(app, method, path, {"content-type": "application/json", **headers}, [body])
    assert (status, pulled) == (401, 0)


@pytest.mark.parametrize("with_length", [True, False])
def test_a_json_body_over_1_mib_is_refused_while_it_streams(tmp_path, with_length):
    app = create_app(settings_for(tmp_path), RecordingRunner())
    chunks = [b" " * (64 * 1024)] * 40  # 2.5 MiB of JSON whitespace, never a complete body
    headers = {"content-type": "application/json", **auth(KEY_A)}
    if with_length:
        headers["content-length"] = str(sum(map(len, chunks)))
    status, pulled = asgi_call(app, "POST", "/v1/jobs", headers, chunks)
    assert status == 413 and pulled == (0 if with_length else 17)  # refused on the chunk that passed 1 MiB
    answer = client(settings_for(tmp_path)).post("/v1/jobs", content=b" " * (MIB + 1),
                                                 headers={"content-type": "application/json", **auth(KEY_A)})
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "request_too_large"
    small = spec("s3://team/in/", "s3://team/out/", prompt={"system": "x" * 1000})
    assert client(settings_for(tmp_path)).post("/v1/jobs", json=small, headers=auth(KEY_A)).status_code == 200


@pytest.mark.parametrize("with_length", [True, False])
def test_an_upload_over_the_limit_is_refused_while_it_streams(tmp_path, with_length):
    app = create_app(settings_for(tmp_path, max_upload_bytes=100_000), RecordingRunner())
    body = _multipart(b"x" * (2 * MIB))
    chunks = [body[i:i + 64 * 1024] for i in range(0, len(body), 64 * 1024)]
    headers = {"content-type": "multipart/form-data; boundary=tmboundary", **auth(KEY_A)}
    if with_length:
        headers["content-length"] = str(len(body))
    status, pulled = asgi_call(app, "POST", "/v1/files", headers, chunks)
    assert status == 413 and pulled < 4  # 100,000 bytes + framing is the third 64 KiB chunk
    c = client(settings_for(tmp_path, max_upload_bytes=100_000))

    def stream():
        yield from chunks  # no Content-Length: chunked transfer

    answer = c.post("/v1/files", content=stream(), headers=headers if not with_length else
                    {k: v for k, v in headers.items() if k != "content-length"})
    assert answer.status_code == 413 and answer.json()["error"] == {
        "message": "File is too large: the limit is 100000 bytes.", "type": "invalid_request_error",
        "param": "file", "code": "file_too_large"}


def test_a_batch_file_holds_at_most_50000_requests(tmp_path):
    c = client(settings_for(tmp_path))
    lines = "".join(json.dumps(_line(i)) + "\n" for i in range(50_000))
    ok = c.post("/v1/files", files={"file": ("in.jsonl", lines.encode())}, data={"purpose": "batch"},
                headers=auth(KEY_A))
    assert ok.status_code == 200, ok.text[:300]
    over = lines + json.dumps(_line(50_000)) + "\n"
    answer = c.post("/v1/files", files={"file": ("in.jsonl", over.encode())}, data={"purpose": "batch"},
                    headers=auth(KEY_A))
    assert answer.status_code == 400 and answer.json()["error"] == {
        "message": "the batch input file has 50001 requests; the limit is 50000", "type": "invalid_request_error",
        "param": "file", "code": "too_many_requests"}


def test_healthz_answers_while_an_upload_is_being_checked(tmp_path, monkeypatch):
    """The upload's check is held until /healthz has answered: on the event loop, it never would."""
    import service.routes_files as routes_files

    entered, release = threading.Event(), threading.Event()
    real_check = routes_files.check_upload

    def held_check(data: bytes, *args):
        entered.set()
        release.wait(60)
        return real_check(data, *args)

    monkeypatch.setattr(routes_files, "check_upload", held_check)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings_for(tmp_path), RecordingRunner()), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: server.started, 30, "the server")
        result: dict = {}
        upload = threading.Thread(target=lambda: result.update(answer=httpx.post(
            base + "/v1/files", files={"file": ("in.jsonl", (json.dumps(_line(0)) + "\n").encode())},
            data={"purpose": "batch"}, headers=auth(KEY_A), timeout=60)))
        upload.start()
        assert entered.wait(30), "the upload never reached its check"
        try:
            health = httpx.get(base + "/healthz", timeout=5)
        finally:
            release.set()
            upload.join(60)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert result["answer"].status_code == 200, result["answer"].text
    finally:
        release.set()
        server.should_exit = True
        thread.join(30)
