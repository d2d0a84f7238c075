"""A key holder is a tenant: what a spec posted to ``/v1/jobs`` may reach (issue 23, points 1-2).

The canary variable goes through every storage-option field a library reads or echoes
(endpoint URL, headers, key, secret, profile); no answer, record, plan or log line may
carry its value, and the server's own storage and local files stay out of reach.
"""

from __future__ import annotations

import json
import logging

import pytest
from tenant_support import CANARY, KEY_A, KEY_B, RecordingRunner, auth, client, settings_for, spec

from connectors import StorageError, filesystem_for
from connectors.redaction import redact
from pipeline.shard_outcome import ShardOutcome, ShardState
from service.errors import APIError

REF = "${env:CANARY_SECRET}"
PLACES = {
    "endpoint_url": {"endpoint_url": REF},
    "client_kwargs.endpoint_url": {"client_kwargs": {"endpoint_url": REF}},
    "headers": {"headers": {"Authorization": REF}},
    "key": {"key": REF},
    "secret": {"key": "AKIDTENANT", "secret": REF},
    "profile": {"profile": REF},
    "token": {"token": REF},
}


@pytest.fixture(autouse=True)
def canary(monkeypatch):
    monkeypatch.setenv("CANARY_SECRET", CANARY)


def _everything_said(c, runner: RecordingRunner, caplog) -> str:
    """Every answer a tenant can get back, every plan the runner got and every log line."""
    said = [c.get("/v1/jobs", headers=auth(k)).text for k in (KEY_A, KEY_B)]
    said += [repr(p.to_dict()) if hasattr(p, "to_dict") else repr(p) for p in runner.plans.values()]
    return "\n".join([*said, caplog.text])


@pytest.mark.parametrize("side", ["input", "output"])
@pytest.mark.parametrize("place", list(PLACES))
def test_a_spec_cannot_reference_a_variable_the_operator_did_not_allow(tmp_path, caplog, place, side):
    caplog.set_level(logging.DEBUG)
    runner = RecordingRunner()
    c = client(settings_for(tmp_path), runner)
    body = spec("s3://team-a/in/", "s3://team-a/out/", **{side: {"storage_options": PLACES[place]}})
    answer = c.post("/v1/jobs", json=body, headers=auth(KEY_A))
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "credential_not_allowed" and error["param"].startswith(f"{side}.storage_options.")
    assert not runner.plans
    assert CANARY not in answer.text + _everything_said(c, runner, caplog)


@pytest.mark.parametrize("place", ["endpoint_url", "client_kwargs.endpoint_url", "headers", "profile"])
def test_an_allowed_variable_still_cannot_be_sent_where_the_spec_chooses(tmp_path, caplog, place):
    """Allowed as a credential, a variable may not be an endpoint, a header or a profile name:
    libraries echo those ("Invalid endpoint: <value>") or send them to the spec's host."""
    runner = RecordingRunner()
    c = client(settings_for(tmp_path, allowed_env=["CANARY_*"]), runner)
    answer = c.post("/v1/jobs", json=spec("s3://team-a/in/", "s3://team-a/out/",
                                          input={"storage_options": PLACES[place]}), headers=auth(KEY_A))
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "credential_not_allowed", answer.text
    assert not runner.plans and CANARY not in answer.text + _everything_said(c, runner, caplog)


def test_an_allowed_credential_goes_to_the_worker_as_a_reference(tmp_path, caplog):
    runner = RecordingRunner()
    c = client(settings_for(tmp_path, allowed_env=["CANARY_*"]), runner)
    answer = c.post("/v1/jobs", json=spec("s3://team-a/in/", "s3://team-a/out/",
                                          input={"storage_options": {"key": "AKIDTENANT", "secret": REF}}),
                    headers=auth(KEY_A))
    assert answer.status_code == 200, answer.text
    (plan,) = runner.plans.values()
    assert plan.storage_options == {"key": "AKIDTENANT", "secret": REF}  # resolved by the worker, never here
    assert CANARY not in answer.text + _everything_said(c, runner, caplog)
    assert c.get(f"/v1/jobs/{answer.json()['id']}", headers=auth(KEY_B)).status_code == 404


def test_a_profile_must_be_one_the_operator_allows(tmp_path):
    c = client(settings_for(tmp_path, allowed_profiles=["team-a"]))
    ok = spec("s3://team-a/in/", "s3://team-a/out/", input={"storage_options": {"profile": "team-a"}})
    assert c.post("/v1/jobs", json=ok, headers=auth(KEY_A)).status_code == 200
    bad = spec("s3://team-a/in/", "s3://team-a/out/", input={"storage_options": {"profile": "prod-admin"}})
    answer = c.post("/v1/jobs", json=bad, headers=auth(KEY_A))
    assert answer.status_code == 400 and answer.json()["error"] == {
        "message": "input.storage_options.profile: profile 'prod-admin' is not one this server allows "
                   "(--allow-profile)", "type": "invalid_request_error", "param": "input.storage_options.profile",
        "code": "credential_not_allowed"}


def test_resolved_credentials_are_cut_from_errors_logs_and_shard_reasons(caplog):
    """Once a credential option resolved the canary in this process, every way text leaves shows
    the reference: storage errors, log lines (tracebacks too), shard reasons, API errors."""
    filesystem_for("s3://bucket/in/", {"key": "AKIDTENANT", "secret": REF})
    assert CANARY not in redact(f"Invalid endpoint: {CANARY}") and REF in redact(f"Invalid endpoint: {CANARY}")
    assert str(StorageError(f"cannot open s3://{CANARY}@bucket")) == f"cannot open s3://{REF}@bucket"
    log = logging.getLogger("tokenmill.test")
    try:
        raise ValueError(f"Invalid endpoint: {CANARY}")
    except ValueError as exc:
        log.warning("opening failed: %s", exc, exc_info=True)
    assert CANARY not in caplog.text and f"opening failed: Invalid endpoint: {REF}" in caplog.text
    assert "raise ValueError" in caplog.text  # the traceback is there, redacted
    outcome = ShardOutcome(0, "s3://bucket/in/a.jsonl", ShardState.FAILED, reason=f"Invalid endpoint: {CANARY}")
    assert outcome.reason == f"Invalid endpoint: {REF}"
    assert APIError(400, f"input error: {CANARY}").body()["error"]["message"] == f"input error: {REF}"


def test_a_resolved_endpoint_or_folder_is_not_taken_for_a_secret(monkeypatch):
    monkeypatch.setenv("TM_TEST_ENDPOINT_HOST", "http://minio.internal.example:9000")
    filesystem_for("s3://bucket/in/", {"client_kwargs": {"endpoint_url": "${env:TM_TEST_ENDPOINT_HOST}"}})
    assert redact("GET http://minio.internal.example:9000/bucket") == "GET http://minio.internal.example:9000/bucket"


def test_key_b_reaches_none_of_key_a_objects_through_any_route(tmp_path):
    runner = RecordingRunner()
    c = client(settings_for(tmp_path), runner)
    a, b = auth(KEY_A), auth(KEY_B)
    line = {"custom_id": "r", "method": "POST", "url": "/v1/completions", "body": {"model": "tiny-test", "prompt": "x"}}
    upload = c.post("/v1/files", files={"file": ("in.jsonl", json.dumps(line).encode())}, data={"purpose": "batch"},
                    headers=a).json()
    batch = c.post("/v1/batches", json={"input_file_id": upload["id"], "endpoint": "/v1/completions",
                                        "completion_window": "24h"}, headers=a).json()
    job = c.post("/v1/jobs", json=spec("s3://team-a/in/", "s3://team-a/out/"), headers=a).json()
    refused = [
        c.get(f"/v1/files/{upload['id']}", headers=b), c.get(f"/v1/files/{upload['id']}/content", headers=b),
        c.delete(f"/v1/files/{upload['id']}", headers=b), c.get(f"/v1/batches/{batch['id']}", headers=b),
        c.post(f"/v1/batches/{batch['id']}/cancel", headers=b), c.get(f"/v1/jobs/{job['id']}", headers=b),
        c.post(f"/v1/jobs/{job['id']}/cancel", headers=b),
        c.post("/v1/batches", json={"input_file_id": upload["id"], "endpoint": "/v1/completions",
                                    "completion_window": "24h"}, headers=b),
    ]
    assert [r.status_code for r in refused] == [404] * len(refused)
    assert all(r.json()["error"]["code"] == "not_found" for r in refused)
    for listing in ("/v1/files", "/v1/batches", "/v1/jobs"):
        assert c.get(listing, headers=b).json()["data"] == []
    assert c.get(f"/v1/files/{upload['id']}/content", headers=a).content == json.dumps(line).encode()
    assert c.get(f"/v1/batches/{batch['id']}", headers=a).json()["status"] == "validating"
    assert runner.states[job["id"]] == "queued"


@pytest.mark.parametrize("extra", [{"endpoint_url": "http://collector.example:9000"},
                                   {"config_kwargs": {"proxies": {"https": "http://proxy.example:3128"}}},
                                   {"client_kwargs": {"endpoint_url": "http://collector.example:9000"}}])
def test_a_spec_using_a_server_credential_cannot_choose_its_route(tmp_path, extra):
    """The credential itself sits where it may, but the spec names the host or proxy it goes to."""
    runner = RecordingRunner()
    c = client(settings_for(tmp_path, allowed_env=["CANARY_*"]), runner)
    options = {"key": "AKIDTENANT", "secret": REF, **extra}
    answer = c.post("/v1/jobs", json=spec("s3://team-a/in/", "s3://team-a/out/", input={"storage_options": options}),
                    headers=auth(KEY_A))
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "credential_not_allowed"
    assert not runner.plans
