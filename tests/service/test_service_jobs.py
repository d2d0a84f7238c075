"""tokenmill's own job routes on the live server and worker: a spec as JSON, status with per-shard
progress (what `tokenmill status` prints), cancel, spec errors named, another key's job a 404."""

from __future__ import annotations

import pytest
from pipeline_support import jsonl_bytes, tiny_engine
from service_stack import wait_for

pytestmark = pytest.mark.services
FINAL = ("succeeded", "completed_with_errors", "cancelled", "failed")


def _spec(tmp_path, model_dir, shards: int, rows: int, max_tokens: int) -> dict:
    for s in range(shards):
        rows_ = [{"id": f"s{s}-{r}", "text": f"document {s} {r} " * 5} for r in range(rows)]
        (tmp_path / "in").mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / f"part-{s}.jsonl").write_bytes(jsonl_bytes(rows_))
    engine = tiny_engine(model_dir)
    return {"name": "api-job", "kind": "summarize", "input": {"url": str(tmp_path / "in")},
            "output": {"url": str(tmp_path / "out")},
            "model": {"path": str(model_dir), **{k: v for k, v in engine.items() if k != "model"}},
            "sampling": {"max_tokens": max_tokens, "ignore_eos": True}}


def test_job_routes_submit_status_cancel(service_stack, tiny_model_dir, tmp_path):
    key_a, key_b = service_stack.keys
    with service_stack.http(key_a) as a, service_stack.http(key_b) as b:
        bad = a.post("/v1/jobs", json={**_spec(tmp_path, tiny_model_dir, 1, 1, 4), "sampling": {"top_p": 0}})
        assert bad.status_code == 400
        assert bad.json()["error"]["message"] == "sampling.top_p: Input should be greater than 0"

        small = a.post("/v1/jobs", json=_spec(tmp_path / "small", tiny_model_dir, 2, 3, 4)).json()
        status = wait_for(lambda: (s := a.get(f"/v1/jobs/{small['id']}").json())["status"] in FINAL and s,
                          120, "the small job")
        assert status["status"] == "succeeded" and status["kind"] == "summarize"
        assert [(s["index"], s["state"], s["rows_done"]) for s in status["shards"]] == [(0, "done", 3), (1, "done", 3)]
        assert status["progress"]["rows_done"] == 6 and status["progress"]["output_tokens"] == 24
        assert b.get(f"/v1/jobs/{small['id']}").status_code == 404
        assert b.post(f"/v1/jobs/{small['id']}/cancel").status_code == 404
        assert small["id"] not in [j["id"] for j in b.get("/v1/jobs").json()["data"]]

        big = a.post("/v1/jobs", json=_spec(tmp_path / "big", tiny_model_dir, 4, 16, 400)).json()
        wait_for(lambda: a.get(f"/v1/jobs/{big['id']}").json()["status"] == "running", 120, "the big job to run")
        assert a.post(f"/v1/jobs/{big['id']}/cancel").json()["status"] in ("cancelling", "cancelled")
        final = wait_for(lambda: (s := a.get(f"/v1/jobs/{big['id']}").json())["status"] in FINAL and s,
                         120, "the cancelled job")
        assert final["status"] == "cancelled"
        assert final["progress"]["shards_cancelled"] >= 1 and final["progress"]["rows_done"] < 64
