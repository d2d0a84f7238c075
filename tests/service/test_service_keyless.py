"""Only ``/healthz``, ``/readyz``, ``/health``, ``/metrics`` and the dashboard's files answer without a key
``/openapi.json`` described every route to anyone before."""

from __future__ import annotations

import pytest
from tenant_support import KEY_A, auth, client, settings_for


@pytest.mark.parametrize("path", ["/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect", "/v1/models",
                                  "/nothing-here", "/static/../openapi.json"])
def test_every_route_but_the_public_ones_needs_a_key(tmp_path, path):
    c = client(settings_for(tmp_path))
    answer = c.get(path)
    assert answer.status_code == 401, (path, answer.text)
    assert answer.json()["error"]["code"] == "missing_api_key"
    assert "paths" not in answer.text


def test_the_api_description_needs_a_key_and_the_doc_pages_are_off(tmp_path):
    c = client(settings_for(tmp_path))
    assert [c.get(p, headers=auth(KEY_A)).status_code for p in ("/openapi.json", "/docs", "/redoc")] == [200, 404, 404]
    assert "/v1/chat/completions" in c.get("/openapi.json", headers=auth(KEY_A)).json()["paths"]


def test_the_public_routes_answer_without_a_key(tmp_path):
    c = client(settings_for(tmp_path))
    assert c.get("/healthz").json()["status"] == "ok"
    assert c.get("/metrics").status_code == 200 and "tokenmill_server_jobs" in c.get("/metrics").text
    assert c.get("/").status_code == 200
    assert c.get("/static/dashboard.js").status_code == 200
    # readiness, for a load balancer or an orchestrator's probe: no model loads here, so "loading"
    assert [c.get(p).status_code for p in ("/readyz", "/health")] == [503, 503]
    assert c.get("/readyz").json()["status"] == "loading"
