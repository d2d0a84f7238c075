"""One normal form, then the prefix check (issue 39, hole 2): every escape form a tenant can spell
is refused, or is proven inside by opening what the policy hands the filesystem.

Each table's forms aim at a private object beside the allowed prefix. "Proven inside" is not
trusted from the normal form: the accepted URL is opened with the real filesystem (local disk,
moto S3, a Python HTTP server that decodes and resolves ``..`` itself) and must not return the
private text.
"""

from __future__ import annotations

import functools
import http.server
import json
import threading
import time

import aiohttp
import pytest
from pipeline_support import tiny_engine
from tenant_support import KEY_A, auth, client, settings_for, spec

from connectors import filesystem_for, read_parts
from jobs.spec import JobSpec
from pipeline.job_status import FINAL_JOB_STATUSES
from service.errors import APIError
from service.runners import EmbeddedRunner

SECRET = "PRIVATE-TEXT-0451"
TARGETS = ["../private/secret.jsonl", ".%2e/private/secret.jsonl", "%2e./private/secret.jsonl",
           ".%2E/private/secret.jsonl", "%2E%2E/private/secret.jsonl", "%252e%252e/private/secret.jsonl",
           "..%2fprivate/secret.jsonl", "..%2Fprivate%2Fsecret.jsonl", "%2e%2e%2fprivate%2fsecret.jsonl",
           "..\\private\\secret.jsonl", "..%5cprivate%5csecret.jsonl", "..;/private/secret.jsonl",
           "%2e%2e;/private/secret.jsonl", "./../private/secret.jsonl", "x/../../private/secret.jsonl",
           "x/%2e%2e/%2e%2e/private/secret.jsonl", "..%252fprivate/secret.jsonl", "..%00/private/secret.jsonl",
           "..%09/private/secret.jsonl", "../../private/secret.jsonl", ".%2e%2fprivate/secret.jsonl",
           "%c0%ae%c0%ae/private/secret.jsonl", "%u002e%u002e/private/secret.jsonl", "...%2fprivate/secret.jsonl",
           "..", "..%2f", "%2e%2e", "//../private/secret.jsonl", "./%2e./private/secret.jsonl"]


def _verdict(policy, url: str, opener, out: str) -> str:
    """'refused', or 'inside' after opening the accepted URL and finding no private text in it."""
    try:
        checked = policy.check(JobSpec.from_dict(spec(url, out)))
    except APIError as exc:
        assert exc.code == "url_not_allowed" and exc.status == 400 and exc.param == "input.url", exc.message
        return "refused"
    try:
        got = opener(checked.input.url)
    except (OSError, ValueError, aiohttp.ClientResponseError):  # missing, a folder, an error: nothing read
        return "inside"
    assert SECRET.encode() not in got, f"{url} -> {checked.input.url} read the private object"
    return "inside"


def _table(prefix: str, extra: list[str]) -> list[str]:
    return [prefix + t for t in TARGETS] + extra


def test_local_escape_forms_are_refused_or_proven_inside(tmp_path):
    root = tmp_path / "allowed"
    (root / "pub" / "x").mkdir(parents=True)
    (root / "private").mkdir()
    (root / "private" / "secret.jsonl").write_text(SECRET)
    (root / "pub" / "link").symlink_to(root / "private", target_is_directory=True)
    policy = settings_for(tmp_path, allowed_url_prefixes=[str(root / "pub")]).spec_policy()
    pub = f"{root}/pub/"
    forms = _table(pub, [f"file://{pub}../private/secret.jsonl", f"file://localhost{pub}", f"{pub}link/secret.jsonl",
                         f"local://{pub}../private/", f"simplecache::file://{pub}", f"{root}/pubx/",
                         f"{root}/PUB/", "~/", f"{pub}../private/*.jsonl", f"{pub}*/../../private/secret.jsonl",
                         f"{pub}\n", f"file:{pub}"])
    verdicts = {u: _verdict(policy, u, lambda u: filesystem_for(u)[0].cat_file(filesystem_for(u)[1]), pub + "out") for u in forms}
    assert len(verdicts) >= 30
    assert verdicts[f"{pub}../private/secret.jsonl"] == verdicts[f"{pub}link/secret.jsonl"] == "refused"


@pytest.fixture
def web(tmp_path):
    """``pub/`` and ``private/`` on a Python HTTP server (which unquotes and resolves ``..`` itself);
    ``pub/moved.jsonl`` redirects to the private file and ``pub/`` links to it."""
    www = tmp_path / "www"
    (www / "pub").mkdir(parents=True)
    (www / "private").mkdir()
    (www / "private" / "secret.jsonl").write_text(json.dumps({"id": "s", "text": SECRET}) + "\n")
    (www / "pub" / "ok.jsonl").write_text('{"id": "p", "text": "public words"}\n')

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path.startswith("/pub/moved"):
                self.send_response(302)
                self.send_header("Location", "/private/secret.jsonl")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if self.path == "/pub/":
                body = b'<a href="ok.jsonl">ok</a> <a href="../private/secret.jsonl">s</a> ' \
                       b'<a href="/private/secret.jsonl">t</a>'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            super().do_GET()

        do_HEAD = do_GET  # noqa: N815

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(www)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_http_escape_forms_are_refused_or_proven_inside(tmp_path, web):
    policy = settings_for(tmp_path, allowed_url_prefixes=[f"{web}/pub/"]).spec_policy()
    host, port = web.removeprefix("http://").split(":")
    pub = f"{web}/pub/"
    forms = _table(pub, [f"http://user:pw@{host}:{port}/pub/", f"http://{host}:{port}@evil.example/pub/",
                         f"http://evil.example@{host}:{port}/pub/", f"http://{host}:{port}\\@evil.example/pub/",
                         f"https://{host}:{port}/pub/", f"http://localhost:{port}/pub/", f"{web}/pubx/secret.jsonl",
                         f"{web}/PUB/", f"{web}//pub/../private/secret.jsonl", f"{pub}?/../private/secret.jsonl",
                         f"{pub}#/../private/secret.jsonl", f"simplecache::{pub}", f"{web}/pub;x=1/",
                         f"{web}/pub%2fx", f"http://{host}:{int(port) + 1}/pub/", f"{pub}moved.jsonl"])

    def opener(url: str) -> bytes:
        fs, path = filesystem_for(url, {"redirects": "within_url"})
        return fs.cat_file(path)

    verdicts = {u: _verdict(policy, u, opener, pub + "out/") for u in forms}
    assert len(verdicts) >= 30
    assert verdicts[f"{pub}.%2e/private/secret.jsonl"] == verdicts[f"{pub}%2e./private/secret.jsonl"] == "refused"
    assert verdicts[f"{pub}moved.jsonl"] == "inside"  # accepted, and its redirect is not followed


def test_s3_escape_forms_are_refused_or_proven_inside(tmp_path, s3_server):
    bucket, other = s3_server.make_bucket(), s3_server.make_bucket()
    s3 = s3_server.client()
    s3.put_object(Bucket=bucket, Key="private/secret.jsonl", Body=SECRET.encode())
    s3.put_object(Bucket=other, Key="secret.jsonl", Body=SECRET.encode())
    s3.put_object(Bucket=bucket, Key="pub/ok.jsonl", Body=b"public")
    policy = settings_for(tmp_path, allowed_url_prefixes=[f"s3://{bucket}/pub/"]).spec_policy()
    pub = f"s3://{bucket}/pub/"
    forms = _table(pub, [f"s3:///{other}/secret.jsonl", f"s3://{bucket}/../{other}/secret.jsonl",
                         f"s3://{bucket}@{other}/secret.jsonl", f"s3://{bucket}:443/pub/", f"s3a://{bucket}/pub/../",
                         f"s3://{bucket.upper()}/pub/", f"{pub}ok.jsonl?versionId=x", f"s3://{bucket}/pubx/",
                         f"s3://{bucket}//pub/../private/secret.jsonl", f"simplecache::{pub}",
                         f"s3://{bucket}%2f..%2f{other}/secret.jsonl", f"gs://{bucket}/pub/"])
    verdicts = {u: _verdict(policy, u, lambda u: filesystem_for(u, s3_server.storage_options)[0].cat_file(u),
                              pub + "out/")
                for u in forms}
    assert len(verdicts) >= 30
    assert verdicts[f"s3:///{other}/secret.jsonl"] == verdicts[f"{pub}../private/secret.jsonl"] == "refused"
    assert _verdict(policy, f"{pub}ok.jsonl", lambda u: b"", pub + "out/") == "inside"


def _run_job(c, body: dict, key: str) -> dict:
    answer = c.post("/v1/jobs", json=body, headers=auth(key))
    assert answer.status_code == 200, answer.text
    job_id = answer.json()["id"]
    for _ in range(600):
        status = c.get(f"/v1/jobs/{job_id}", headers=auth(key)).json()
        if status["status"] in FINAL_JOB_STATUSES:
            return status
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish: {status}")


def test_a_job_reads_no_private_text_through_an_allowed_http_prefix(tmp_path, web, tiny_model_dir):
    """Hole 2 end to end: the ``.%2e`` URL is refused; a glob over the allowed ``pub/`` folder, whose
    page links to the private file, reads only ``pub/ok.jsonl``; ``pub/moved.jsonl``, which redirects
    to the private file, is not followed (the job is refused at submit: no input file)."""
    engine = {k: v for k, v in tiny_engine(tiny_model_dir).items() if k != "model"}
    settings = settings_for(tmp_path, allowed_url_prefixes=[f"{web}/pub/", str(tmp_path / "out")],
                            model=str(tiny_model_dir), engine_options=engine)
    c = client(settings, EmbeddedRunner())
    model = {"path": str(tiny_model_dir), **engine}
    job = {"input": {"id_field": "id", "format": "jsonl"}, "model": model,
           "sampling": {"max_tokens": 2, "ignore_eos": True}}
    refused = c.post("/v1/jobs", json=spec(f"{web}/pub/.%2e/private/secret.jsonl", str(tmp_path / "out/a"), **job),
                     headers=auth(KEY_A))
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "url_not_allowed"
    listed = _run_job(c, spec(f"{web}/pub/**", str(tmp_path / "out/listed"), **job), KEY_A)
    assert listed["status"] == "succeeded", listed
    assert read_parts(str(tmp_path / "out/listed")).column("id").to_pylist() == ["p"]
    moved = c.post("/v1/jobs", json=spec(f"{web}/pub/moved.jsonl", str(tmp_path / "out/moved"), **job),
                   headers=auth(KEY_A))
    assert moved.status_code == 400 and moved.json()["error"]["code"] == "input_error", moved.text
    for path in (tmp_path / "out").rglob("*"):
        assert not path.is_file() or SECRET.encode() not in path.read_bytes(), path
