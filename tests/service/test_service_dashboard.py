"""The dashboard in a real browser: Debian's headless Chromium driven by Playwright, against the
session's live ``tokenmill serve`` and worker. It watches a job submitted through ``POST /v1/jobs``
appear, run and succeed, and a failed shard show its reason; then it saves a screenshot
($TOKENMILL_SCREENSHOT names a copy, e.g. docs/dashboard.png for the README).

Chromium missing is a failure, not a skip: ``make test`` installs it (see the Makefile).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from pipeline_support import jsonl_bytes, tiny_engine, write_uniform_shards
from service_stack import wait_for

pytestmark = pytest.mark.services
CHROMIUM = os.environ.get("TOKENMILL_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-extensions", "--no-first-run"]
TIMEOUT_MS = 180_000


def _spec(name: str, input_dir: Path, output_dir: Path, model_dir: Path, max_tokens: int) -> dict:
    engine = tiny_engine(model_dir)
    return {"name": name, "kind": "summarize",
            "input": {"url": str(input_dir), "passthrough": ["lang"]},
            "output": {"url": str(output_dir)},
            "model": {"path": str(model_dir), **{k: v for k, v in engine.items() if k != "model"}},
            "prompt": {"system": "Summarize the document in one sentence."},
            "sampling": {"max_tokens": max_tokens, "ignore_eos": True}}


def _put(root: Path):
    def put(name: str, data: bytes) -> None:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)

    return put


def test_dashboard_shows_a_job_run_to_completion_and_a_failed_shard(service_stack, tiny_model_dir, tmp_path):
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (make test does it)")
    from playwright.sync_api import expect, sync_playwright

    key = service_stack.keys[0]
    good_in, bad_in = tmp_path / "in", tmp_path / "bad-in"
    ids = write_uniform_shards(_put(good_in), count=6, rows=8)
    _put(bad_in)("a.jsonl", jsonl_bytes([{"id": "x", "text": "fine", "lang": "en"}]))
    _put(bad_in)("b.parquet", b"this is not a parquet file")

    with sync_playwright() as p, service_stack.http(key) as http:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(f"{service_stack.url}/#key={key}")
            expect(page.locator("#health")).to_contain_text("fleet")

            response = http.post("/v1/jobs", json=_spec("dash", good_in, tmp_path / "out", tiny_model_dir, 384))
            assert response.status_code == 200, response.text
            job_id = response.json()["id"]
            row = page.locator(f'#jobs tr[data-job-id="{job_id}"]')
            expect(row).to_have_attribute("data-status", "running", timeout=TIMEOUT_MS)
            expect(row).to_have_attribute("data-status", "succeeded", timeout=TIMEOUT_MS)
            row.click()
            expect(page.locator("#detail-id")).to_have_text(job_id)
            expect(page.locator('#shards tr[data-state="done"]')).to_have_count(6)
            expect(page.locator("#gauges")).to_contain_text(str(len(ids)))
            # the tokens/s line was drawn from the polls made while the job ran
            blue = page.evaluate("""() => { const c = document.getElementById('chart');
                const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0;
                for (let i = 0; i < d.length; i += 4) if (d[i] < 40 && d[i+1] > 80 && d[i+1] < 130 && d[i+2] > 190) n++;
                return n; }""")
            assert blue > 50

            failing = http.post("/v1/jobs", json=_spec("dash-bad", bad_in, tmp_path / "bad-out", tiny_model_dir, 4))
            bad_id = failing.json()["id"]
            bad_row = page.locator(f'#jobs tr[data-job-id="{bad_id}"]')
            expect(bad_row).to_have_attribute("data-status", "completed_with_errors", timeout=TIMEOUT_MS)
            expect(page.locator("#failed tbody")).to_contain_text("b.parquet", timeout=10_000)
            row.click()
            expect(page.locator("#detail-id")).to_have_text(job_id)
            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            if os.environ.get("TOKENMILL_SCREENSHOT"):
                shutil.copy(shot, os.environ["TOKENMILL_SCREENSHOT"])
        finally:
            browser.close()
    status = wait_for(lambda: http_status(service_stack, key, job_id), 30, "job status")
    assert status["progress"]["rows_done"] == len(ids)


def http_status(stack, key: str, job_id: str) -> dict:
    with stack.http(key) as http:
        return http.get(f"/v1/jobs/{job_id}").json()
