"""Storage credentials stay where they are: a fleet's workers resolve ``"${env:NAME}"`` from
their own environment and nothing secret crosses the broker or sits in Redis; credentials
in a URL never reach the manifest or part footers; a job reads from one store and writes to
another with ``[input.storage_options]`` and ``[output.storage_options]``."""

from __future__ import annotations

import base64
import functools
import http.server
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pipeline_support import jsonl_bytes, make_plan, tiny_engine
from s3_server import S3Server
from test_celery_fleet import REDIS_BROKER, RESULT_BACKEND, Fleet, _make_fleet, _require

from connectors import StorageError, filesystem_for, read_manifest, read_parts, success_marker_exists
from jobs.api import run
from jobs.spec import JobSpec
from pipeline.fleet import wait_for_job
from pipeline.job_runner import run_embedded

MARKER = f"MARKER-SECRET-{uuid.uuid4().hex}"


def _spec(model_dir: Path, input_url: str, output_url: str, name: str = "creds", **sections: Any) -> JobSpec:
    data: dict[str, Any] = {
        "name": name, "input": {"url": input_url, "id_field": "id"}, "output": {"url": output_url},
        "model": {k if k != "model" else "path": v for k, v in tiny_engine(model_dir).items()},
        "sampling": {"max_tokens": 2, "ignore_eos": True},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return JobSpec.from_dict(data)


def _docs(name: str, count: int) -> list[dict[str, str]]:
    return [{"id": f"{name}{i}", "text": f"document {i} of {name}"} for i in range(count)]


def _redis_dump() -> str:
    """Every value in the broker's and the result backend's databases, as text."""
    chunks = []
    for url in (REDIS_BROKER, RESULT_BACKEND):
        r = redis.Redis.from_url(url)
        for key in r.scan_iter(count=1000):
            kind = r.type(key).decode()
            if kind == "string":
                values = [r.get(key)]
            elif kind == "list":
                values = r.lrange(key, 0, -1)
            elif kind == "hash":
                values = [v for kv in r.hgetall(key).items() for v in kv]
            elif kind == "set":
                values = list(r.smembers(key))
            elif kind == "zset":
                values = r.zrange(key, 0, -1)
            else:
                values = []
            chunks += [key, *(v for v in values if v is not None)]
    return "\n".join(_decoded(c.decode("utf-8", "replace")) for c in chunks)


def _decoded(text: str) -> str:
    """A kombu message as stored by the Redis transport has a base64 body: add it decoded."""
    try:
        message = json.loads(text)
    except ValueError:
        return text
    if isinstance(message, list) and message and isinstance(message[0], str):  # unacked: [message, exchange, key]
        return text + "\n" + _decoded(message[0])
    if isinstance(message, dict) and isinstance(message.get("body"), str):
        if (message.get("properties") or {}).get("body_encoding") == "base64":
            return text + "\n" + base64.b64decode(message["body"]).decode("utf-8", "replace")
    return text


# ---- 11: the broker never carries a credential ---------------------------------------------------


@pytest.fixture(scope="module")
def env_credential_fleet(tmp_path_factory, s3_server, tiny_model_dir) -> Iterator[Fleet]:
    """Workers holding the S3 endpoint and secret in their own environment, under names the
    spec refers to (the test process has them too: it lists the input at submit)."""
    _require(6379, "Redis")
    env = {"TM_TEST_S3_ENDPOINT": s3_server.endpoint_url, "TM_TEST_S3_KEY": "testing", "TM_TEST_S3_SECRET": MARKER,
           "AWS_DEFAULT_REGION": "us-east-1"}
    yield from _make_fleet(REDIS_BROKER, tmp_path_factory, tiny_model_dir, env, pool="threads")


def test_credentials_reach_workers_from_their_environment_never_through_the_broker(
    env_credential_fleet: Fleet, s3_server, s3_bucket, tiny_model_dir
) -> None:
    s3 = s3_server.client()
    for name in ("a", "b"):
        s3.put_object(Bucket=s3_bucket, Key=f"in/{name}.jsonl", Body=jsonl_bytes(_docs(name, 3)))
    options = {"key": "${env:TM_TEST_S3_KEY}", "secret": "${env:TM_TEST_S3_SECRET}",
               "client_kwargs": {"endpoint_url": "${env:TM_TEST_S3_ENDPOINT}"}}
    spec = _spec(tiny_model_dir, f"s3://{s3_bucket}/in/", f"s3://{s3_bucket}/out/",
                 input={"storage_options": options})

    literal_marker = f"LITERAL-SECRET-{uuid.uuid4().hex}"
    literal = _spec(tiny_model_dir, f"s3://{s3_bucket}/in/", f"s3://{s3_bucket}/literal/",
                    input={"storage_options": {**options, "secret": literal_marker}})
    with pytest.raises(ValueError, match=r"input\.storage_options\.secret: a credential in the spec would travel"):
        env_credential_fleet.submit(literal.to_plan(f"test-literal-{uuid.uuid4().hex[:8]}"))

    job_id = env_credential_fleet.submit(spec.to_plan(f"test-envcreds-{uuid.uuid4().hex[:8]}"))
    queued = _redis_dump()  # no worker yet: both shard messages and the finalizer sit in the queue
    assert queued.count("${env:TM_TEST_S3_SECRET}") >= 3
    assert MARKER not in queued and literal_marker not in queued

    env_credential_fleet.ensure(1)
    status = wait_for_job(job_id, 300, poll_s=0.5)
    assert status["status"] == "succeeded", env_credential_fleet.logs()
    out = f"s3://{s3_bucket}/out/"
    assert sorted(read_parts(out, s3_server.storage_options).column("id").to_pylist()) == [
        f"{n}{i}" for n in "ab" for i in range(3)]
    assert success_marker_exists(out, s3_server.storage_options)
    everything = _redis_dump()  # results, chord counters, job state
    assert job_id in everything and MARKER not in everything and literal_marker not in everything


def test_cli_submit_refuses_a_literal_credential_before_touching_the_broker(tmp_path: Path, tiny_model_dir) -> None:
    from typer.testing import CliRunner

    from cli.app import app

    (tmp_path / "in").mkdir()
    (tmp_path / "in/a.jsonl").write_bytes(jsonl_bytes(_docs("a", 1)))
    spec = tmp_path / "literal.toml"
    spec.write_text(f'name = "literal"\n[input]\nurl = "in/"\n[input.storage_options]\npassword = "{MARKER}"\n'
                    f'[output]\nurl = "out/"\n')
    result = CliRunner().invoke(app, ["submit", str(spec), "--broker", "redis://127.0.0.1:1/0"])
    assert result.exit_code == 2, result.output
    assert "spec error: input.storage_options.password: a credential in the spec would travel" in result.output
    assert MARKER not in result.output


def test_a_scheduled_spec_with_a_literal_credential_is_refused(tmp_path: Path, tiny_model_dir) -> None:
    from jobs.scheduled import beat_schedule

    spec = _spec(tiny_model_dir, "s3://b/in/", "s3://b/out/", input={"storage_options": {"secret": MARKER}},
                 schedule="every 60s")
    with pytest.raises(ValueError, match=r"input\.storage_options\.secret: a scheduled spec travels"):
        beat_schedule({tmp_path / "a.toml": spec}, None, "q")


def test_an_unset_reference_is_an_error_naming_the_variable(tmp_path: Path, tiny_model_dir) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in/a.jsonl").write_bytes(jsonl_bytes(_docs("a", 1)))
    assert filesystem_for(str(tmp_path), {"auto_mkdir": "${env:HOME}"})[0] is not None
    plan = make_plan(str(tmp_path / "in"), str(tmp_path / "out"), tiny_model_dir,
                     output_storage_options={"auto_mkdir": "${env:TM_TEST_NOT_SET}"})
    with pytest.raises(StorageError, match=r"auto_mkdir refers to \$\{env:TM_TEST_NOT_SET\}, which is not set in"):
        run_embedded(plan, progress=False)


# ---- 11: user:password@ in an input URL ------------------------------------------------------------


@pytest.fixture
def http_input(tmp_path: Path) -> Iterator[str]:
    """A loopback HTTP server over tmp_path/www, as ``http://<user>:<MARKER>@host:port``."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://reader:{MARKER}@127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_credentials_in_an_input_url_reach_neither_manifest_nor_parts(http_input: str, tmp_path: Path,
                                                                     tiny_model_dir) -> None:
    (tmp_path / "www/docs.jsonl").write_bytes(jsonl_bytes(_docs("d", 3)))
    (tmp_path / "www/broken.jsonl.gz").write_bytes(b"not gzip at all")
    out = tmp_path / "out"
    plan = make_plan(f"{http_input}/docs.jsonl", str(out), tiny_model_dir, passthrough_fields=[],
                     prompt={"system": "Summarize.", "user_template": "{text}"})
    plan = type(plan).from_dict(plan.to_dict())
    manifest = run_embedded(plan, progress=False)
    assert manifest["status"] == "succeeded" and manifest["totals"]["rows"] == 3
    bad = type(plan).from_dict({**plan.to_dict(), "input_url": f"{http_input}/broken.jsonl.gz",
                                "output_url": str(tmp_path / "out-bad")})
    failed = run_embedded(bad, progress=False)
    assert failed["status"] == "completed_with_errors" and "reader:" not in failed["shards"][0]["reason"]
    files = [p for p in [*out.rglob("*"), *(tmp_path / "out-bad").rglob("*")] if p.is_file()]
    assert any(p.name.endswith(".parquet") for p in files) and any(p.name == "_manifest.json" for p in files)
    for path in files:
        assert MARKER.encode() not in path.read_bytes(), path
    assert read_manifest(str(out))["shards"][0]["url"].startswith("http://127.0.0.1:")

    from pipeline.fleet import check_no_secrets

    with pytest.raises(ValueError, match=r"input\.url: user:password@ in the URL would travel"):
        check_no_secrets(plan)


# ---- 13: input and output on different stores -------------------------------------------------------


@pytest.fixture(scope="module")
def second_s3() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


def test_input_and_output_on_two_s3_endpoints(s3_server, s3_bucket, second_s3: S3Server, tmp_path: Path,
                                             tiny_model_dir) -> None:
    """Read from one S3 endpoint, write parts, manifest, _SUCCESS and the merged OpenAI output
    to another, each with its own storage options from the spec (TOML)."""
    s3_server.client().put_object(Bucket=s3_bucket, Key="in/a.jsonl", Body=jsonl_bytes(_docs("a", 3)))
    out_bucket = second_s3.make_bucket()
    spec_file = tmp_path / "two-stores.toml"
    model = "\n".join(f"{k if k != 'model' else 'path'} = {json.dumps(v)}" for k, v in tiny_engine(tiny_model_dir).items())
    spec_file.write_text(
        f'name = "two-stores"\n'
        f'[input]\nurl = "s3://{s3_bucket}/in/"\nid_field = "id"\n'
        f'[input.storage_options]\nkey = "testing"\nsecret = "testing"\n'
        f'client_kwargs = {{ endpoint_url = "{s3_server.endpoint_url}" }}\n'
        f'[output]\nurl = "s3://{out_bucket}/out/"\nopenai_format = true\n'
        f'[output.storage_options]\nkey = "testing"\nsecret = "testing"\n'
        f'client_kwargs = {{ endpoint_url = "{second_s3.endpoint_url}" }}\n'
        f'[model]\n{model}\n[sampling]\nmax_tokens = 2\nignore_eos = true\n'
    )
    manifest = run(str(spec_file), progress=False)
    assert manifest["status"] == "succeeded"
    out_keys = {o["Key"] for o in second_s3.client().list_objects_v2(Bucket=out_bucket)["Contents"]}
    assert {"out/_manifest.json", "out/_SUCCESS", "out/output.jsonl", *(f"out/{p}" for p in manifest["parts"])} <= out_keys
    in_keys = {o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_bucket)["Contents"]}
    assert in_keys == {"in/a.jsonl"}  # nothing written on the input's store
    out_options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": second_s3.endpoint_url}}
    assert read_parts(f"s3://{out_bucket}/out/", out_options).column("id").to_pylist() == ["a0", "a1", "a2"]
