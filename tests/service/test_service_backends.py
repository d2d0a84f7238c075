"""Every fsspec protocol a spec can name is in the credential and endpoint policy (issue 39):
a protocol the policy does not open over HTTP is refused even under a prefix the operator allowed."""

from __future__ import annotations

import fsspec
import pytest
from tenant_support import KEY_A, RecordingRunner, auth, client, settings_for, spec

from connectors.backends import BACKENDS

REFUSED = sorted(p for p, b in BACKENDS.items() if not b.over_http)


def test_the_policy_lists_every_protocol_fsspec_knows():
    """A new fsspec release or plugin adds protocols: each must be listed before a spec may use it."""
    assert set(fsspec.available_protocols()) <= set(BACKENDS)
    for name in ("s3", "gs", "az", "abfs", "http", "https"):
        assert BACKENDS[name].over_http and BACKENDS[name].credential_options, name
    assert {"endpoint_url", "client_kwargs.endpoint_url"} <= BACKENDS["s3"].endpoint_options
    assert all(b.why for b in BACKENDS.values() if not b.over_http)


@pytest.mark.parametrize("protocol", [*REFUSED, "nosuchfs"])
def test_a_protocol_not_opened_over_http_is_refused_under_an_allowed_prefix(tmp_path, protocol):
    runner = RecordingRunner()
    c = client(settings_for(tmp_path, allowed_url_prefixes=[f"{protocol}://team-a"]), runner)
    answer = c.post("/v1/jobs", json=spec(f"{protocol}://team-a/in/", f"{protocol}://team-a/out/"),
                    headers=auth(KEY_A))
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "url_not_allowed" and error["param"] == "input.url"
    assert not runner.plans


@pytest.mark.parametrize(("protocol", "option"), [("az", {"account_host": "collector.example"}),
                                                  ("abfs", {"account_host": "collector.example"}),
                                                  ("gs", {"endpoint_url": "http://collector.example"})])
def test_a_backends_own_endpoint_option_is_not_the_specs_with_a_server_credential(tmp_path, protocol, option):
    c = client(settings_for(tmp_path, allowed_env=["TEAM_*"]))
    options = {"account_key" if protocol != "gs" else "token": "${env:TEAM_SECRET}", **option}
    answer = c.post("/v1/jobs", json=spec(f"{protocol}://c/in/", f"{protocol}://c/out/",
                                          input={"storage_options": options}), headers=auth(KEY_A))
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "credential_not_allowed", answer.text
    assert answer.json()["error"]["param"].endswith(next(iter(option)))
