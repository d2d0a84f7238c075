"""A team's results are its own; each key has its own scope (issue 39, holes 1 and point 7).

Hole 1 as the probe found it: key A's job wrote ``allowed/team-a/results``; key B then posted a
job with that folder as its output (it replaced A's part) and one reading A's parts. Both must
be refused, after A's run has ended and after the server restarted, on local paths and on S3.
"""

from __future__ import annotations

import time

import pytest
from pipeline_support import jsonl_bytes, tiny_engine
from tenant_support import KEY_A, KEY_B, RecordingRunner, auth, client, settings_for, spec

from connectors import read_parts
from connectors.blobs import read_bytes
from pipeline.job_status import FINAL_JOB_STATUSES
from service.runners import EmbeddedRunner
from service.settings import SettingsError, load_keys


def _finished(c, job_id: str, key: str) -> dict:
    for _ in range(600):
        status = c.get(f"/v1/jobs/{job_id}", headers=auth(key)).json()
        if status["status"] in FINAL_JOB_STATUSES:
            return status
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish: {status}")


@pytest.fixture(params=["local", "s3"])
def allowed(request, tmp_path, monkeypatch) -> tuple[str, str]:
    """(an allowed prefix shared by both keys holding ``in/docs.jsonl``, the service's storage)."""
    docs = jsonl_bytes([{"id": f"d{i}", "text": f"document {i}"} for i in range(3)])
    if request.param == "local":
        (tmp_path / "allowed" / "in").mkdir(parents=True)
        (tmp_path / "allowed" / "in" / "docs.jsonl").write_bytes(docs)
        return str(tmp_path / "allowed"), str(tmp_path / "storage")
    server = request.getfixturevalue("s3_server")
    bucket = server.make_bucket()
    server.client().put_object(Bucket=bucket, Key="allowed/in/docs.jsonl", Body=docs)
    monkeypatch.setenv("TOKENMILL_S3_ENDPOINT_URL", server.endpoint_url)
    return f"s3://{bucket}/allowed", f"s3://{bucket}/svc"


def test_key_b_can_neither_overwrite_nor_read_key_a_results(tmp_path, allowed, tiny_model_dir):
    prefix, storage = allowed
    engine = {k: v for k, v in tiny_engine(tiny_model_dir).items() if k != "model"}
    settings = settings_for(tmp_path, storage_url=storage, allowed_url_prefixes=[prefix],
                            model=str(tiny_model_dir), engine_options=engine)
    job = {"input": {"id_field": "id"}, "sampling": {"max_tokens": 2, "ignore_eos": True}}
    results = f"{prefix}/team-a/results"
    c = client(settings, EmbeddedRunner())
    posted = c.post("/v1/jobs", json=spec(f"{prefix}/in/", results, **job), headers=auth(KEY_A))
    assert posted.status_code == 200, posted.text
    assert _finished(c, posted.json()["id"], KEY_A)["status"] == "succeeded"
    before = read_parts(results).column("id").to_pylist()
    marker = read_bytes(f"{results}/_SUCCESS")

    c = client(settings, RecordingRunner())  # a restarted server: no lease, no memory of the run
    attempts = {
        "output.url": [spec(f"{prefix}/in/", results, **job), spec(f"{prefix}/in/", f"{results}/sub", **job),
                       spec(f"{prefix}/in/", f"{prefix}/team-a", **job),
                       spec(f"{prefix}/in/", f"{prefix}//team-a/results/", **job)],
        "input.url": [spec(f"{results}/", f"{prefix}/team-b/out", **job),
                      spec(f"{prefix}/", f"{prefix}/team-b/out", input={"glob": "team-a/results/*.parquet"}),
                      spec(f"{prefix}", f"{prefix}/team-b/out2", **job)],
    }
    for param, bodies in attempts.items():
        for body in bodies:
            answer = c.post("/v1/jobs", json=body, headers=auth(KEY_B))
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["code"] == "output_owned" and answer.json()["error"]["param"] == param
    assert read_parts(results).column("id").to_pylist() == before and read_bytes(f"{results}/_SUCCESS") == marker
    again = c.post("/v1/jobs", json=spec(f"{prefix}/in/", results, **job), headers=auth(KEY_A))
    assert again.status_code == 200, again.text  # the owner may write there again
    mine = c.post("/v1/jobs", json=spec(f"{prefix}/in/", f"{prefix}/team-b/out", **job), headers=auth(KEY_B))
    assert mine.status_code == 200, mine.text


def _keys_file(tmp_path, body: str):
    path = tmp_path / "keys.toml"
    path.write_text(body)
    return path


SCOPED = """
# two teams, one shared read-only dataset
[shared]
read = ["{root}/datasets"]

[[keys]]
name = "team-a"
key = "key-a-tenant"
write = ["{root}/team-a", "s3://team-a-bucket"]
allow_env = ["TEAM_A_*"]
models = ["{root}/models/a"]

[[keys]]
name = "team-b"
key_env = "TM_TEST_KEY_B"
read = ["{root}/team-b-in"]
write = ["{root}/team-b", "s3://team-b-bucket"]
"""


def _scoped_client(tmp_path, monkeypatch):
    monkeypatch.setenv("TM_TEST_KEY_B", KEY_B)
    keys, scopes, shared = load_keys(None, _keys_file(tmp_path, SCOPED.format(root=tmp_path)))
    assert keys == [KEY_A, KEY_B] and [s.name for s in scopes.values()] == ["team-a", "team-b"]
    return client(settings_for(tmp_path, api_keys=keys, key_scopes=scopes, shared=shared))


def _error(answer) -> tuple[str, str]:
    assert answer.status_code == 400, answer.text
    return answer.json()["error"]["code"], answer.json()["error"]["param"]


def test_each_key_reads_and_writes_only_its_own_prefixes_and_the_shared_ones(tmp_path, monkeypatch):
    c = _scoped_client(tmp_path, monkeypatch)
    a, b, root = auth(KEY_A), auth(KEY_B), tmp_path
    for where in ("datasets", "team-a", "team-b", "team-b-in"):
        (root / where).mkdir()
    assert c.post("/v1/jobs", json=spec(f"{root}/datasets", f"{root}/team-a/out"), headers=a).status_code == 200
    assert c.post("/v1/jobs", json=spec(f"{root}/team-b-in", f"{root}/team-b/out"), headers=b).status_code == 200
    assert _error(c.post("/v1/jobs", json=spec(f"{root}/team-b-in", f"{root}/team-a/o2"), headers=a)) == (
        "url_not_allowed", "input.url")
    assert _error(c.post("/v1/jobs", json=spec(f"{root}/datasets", f"{root}/team-a/o3"), headers=b)) == (
        "url_not_allowed", "output.url")
    assert _error(c.post("/v1/jobs", json=spec(f"{root}/team-a", f"{root}/team-b/o"), headers=b)) == (
        "url_not_allowed", "input.url")
    shared_write = c.post("/v1/jobs", json=spec(f"{root}/datasets", f"{root}/datasets/mine"), headers=a)
    assert _error(shared_write) == ("url_not_allowed", "output.url")  # shared is read-only
    assert "outside the prefixes this key may write" in shared_write.json()["error"]["message"]


def test_allowed_variables_and_models_are_per_key(tmp_path, monkeypatch):
    c = _scoped_client(tmp_path, monkeypatch)
    for where in ("datasets", "team-a", "team-b", "models/a"):
        (tmp_path / where).mkdir(parents=True)
    creds = {"input": {"storage_options": {"key": "AKID", "secret": "${env:TEAM_A_SECRET}"}}}
    b_spec = spec("s3://team-b-bucket/in/", "s3://team-b-bucket/out/", **creds)
    assert _error(c.post("/v1/jobs", json=b_spec, headers=auth(KEY_B))) == (
        "credential_not_allowed", "input.storage_options.secret")
    a_spec = spec("s3://team-a-bucket/in/", "s3://team-a-bucket/out/", **creds)
    assert c.post("/v1/jobs", json=a_spec, headers=auth(KEY_A)).status_code == 200
    model_a = {"model": {"path": str(tmp_path / "models/a")}}
    ok = c.post("/v1/jobs", json=spec(f"{tmp_path}/datasets", f"{tmp_path}/team-a/o", **model_a), headers=auth(KEY_A))
    assert ok.status_code == 200, ok.text
    refused = c.post("/v1/jobs", json=spec(f"{tmp_path}/datasets", f"{tmp_path}/team-b/o", **model_a),
                     headers=auth(KEY_B))
    assert _error(refused) == ("model_not_allowed", "model.path")
    other = {"model": {"name": "gemma3-270m"}}  # registered, but not listed: a download
    assert _error(c.post("/v1/jobs", json=spec(f"{tmp_path}/datasets", f"{tmp_path}/team-a/p", **other),
                         headers=auth(KEY_A))) == ("model_not_allowed", "model.name")


def test_old_keys_files_still_load_and_a_bad_scoped_one_is_named(tmp_path):
    plain = tmp_path / "keys.txt"
    plain.write_text("# keys\nsk-1\nsk-2\n")
    assert load_keys(None, plain)[0] == ["sk-1", "sk-2"] and load_keys(None, plain)[1] == {}
    with pytest.raises(SettingsError, match=r"keys\.0\.writ: Extra inputs are not permitted"):
        load_keys(None, _keys_file(tmp_path, '[[keys]]\nname = "a"\nkey = "k"\nwrit = []\n'))
    with pytest.raises(SettingsError, match="keys 'a': key_env TM_TEST_UNSET_KEY is not set"):
        load_keys(None, _keys_file(tmp_path, '[[keys]]\nname = "a"\nkey_env = "TM_TEST_UNSET_KEY"\n'))
