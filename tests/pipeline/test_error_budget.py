"""A job whose rows mostly failed says so (issue 41, point 1): over the error budget the
manifest is ``failed`` and names the commonest error, no ``_SUCCESS`` is written, the parts
stay, and ``tokenmill run`` exits non-zero. The fleet's finalizer applies the same rule; an
OpenAI batch keeps its own (its errors go to the error file)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from pipeline_support import Where, jsonl_bytes, make_plan, tiny_model_toml
from typer.testing import CliRunner

from cli.app import app
from connectors import read_manifest, read_parts, success_marker_exists
from jobs import JobSpec
from pipeline import tasks
from pipeline.error_budget import EXAMPLE_CHARS, apply_error_budget, commonest
from pipeline.job_runner import run_embedded
from pipeline.plan import DEFAULT_MAX_ERROR_FRACTION
from pipeline.publish import begin_output
from pipeline.shard_outcome import ShardOutcome

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _rows(bad: int, total: int = 10) -> list[dict[str, Any]]:
    """``total`` rows, the first ``bad`` of them without the ``text`` field."""
    return [{"id": f"d{i}", ("body" if i < bad else "text"): f"document {i}", "lang": "en"} for i in range(total)]


def _plan(where: Where, model_dir: Path, bad: int, **overrides: Any):
    where.put("docs.jsonl", jsonl_bytes(_rows(bad)))
    return make_plan(where.input_url, where.output_url, model_dir, storage_options=where.options, **overrides)


def test_a_job_whose_rows_all_failed_is_failed_and_keeps_its_parts(where: Where, tiny_model_dir: Path) -> None:
    plan = _plan(where, tiny_model_dir, bad=10)
    manifest = run_embedded(plan, progress=False)
    assert manifest["status"] == "failed"
    assert manifest["error"] == ("10 of 10 rows failed (100%; over max_error_fraction 0.5); "
                                 "commonest error (10 rows): missing text field 'text'")
    written = read_manifest(plan.output_url, plan.output_options)
    assert written["status"] == "failed" and written["error"] == manifest["error"]
    assert not success_marker_exists(plan.output_url, plan.output_options)
    assert read_parts(plan.output_url, plan.output_options).num_rows == 10  # kept for inspection


def test_the_commonest_error_is_counted_figures_aside_and_shown_on_one_line() -> None:
    """Not the first error: the one most rows share, whatever their row numbers and lengths."""
    errors = ["row 0: missing text field 'text'", None,
              "row 2: prompt of 900 tokens exceeds max_model_len 512",
              "row 3: prompt of 1200 tokens exceeds max_model_len 512",
              "row 4: template error\n  line 1\n    {{ x }}", "row 5: template error\n  line 1\n    {{ x }}",
              "row 6: prompt of 700 tokens exceeds max_model_len 512"]
    assert commonest(errors) == ("prompt of 900 tokens exceeds max_model_len 512", 3)
    assert commonest(errors[4:6]) == ("template error line 1 {{ x }}", 2)  # one line
    (text, count) = commonest([f"row {i}: " + "x" * 1000 for i in range(3)])
    assert count == 3 and len(text) == EXAMPLE_CHARS and text.endswith("...")
    assert commonest([None, ""]) is None


def test_the_budget_keeps_an_error_publishing_found(tmp_path: Path, tiny_model_dir: Path) -> None:
    plan = make_plan(str(tmp_path / "in"), str(tmp_path / "out"), tiny_model_dir)
    manifest = {"status": "succeeded", "success_marker": False, "shards": [], "totals": {"rows": 10, "errors": 9},
                "error": "cannot remove stale parts: OSError: denied"}
    apply_error_budget(plan, manifest)
    assert manifest["status"] == "failed" and manifest["error"] == (
        "cannot remove stale parts: OSError: denied; 9 of 10 rows failed (90%; over max_error_fraction 0.5)")


def test_the_budget_is_a_fraction_and_a_count(where: Where, tiny_model_dir: Path) -> None:
    plan = _plan(where, tiny_model_dir, bad=5)  # half: within the default budget
    assert run_embedded(plan, progress=False)["status"] == "succeeded"
    assert success_marker_exists(plan.output_url, plan.output_options)
    strict = dataclasses.replace(plan, job_id="strict", max_error_rows=4)
    manifest = run_embedded(strict, progress=False)  # parts current: the same rows, another budget
    assert manifest["totals"]["shards_skipped"] == 1
    assert manifest["status"] == "failed"
    assert manifest["error"].startswith("5 of 10 rows failed (50%; over max_error_fraction 0.5, max_error_rows 4)")
    assert not success_marker_exists(plan.output_url, plan.output_options)


def test_a_budget_of_one_accepts_every_error(where: Where, tiny_model_dir: Path) -> None:
    plan = _plan(where, tiny_model_dir, bad=10, max_error_fraction=1.0)
    assert run_embedded(plan, progress=False)["status"] == "succeeded"
    assert success_marker_exists(plan.output_url, plan.output_options)


def test_the_fleet_finalizer_applies_the_budget(where: Where, tiny_model_dir: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _plan(where, tiny_model_dir, bad=7, max_error_fraction=1.0)
    shards = run_embedded(plan, progress=False)["shards"]  # the parts a fleet's shards would have written
    monkeypatch.setattr(tasks, "_store", lambda: None)
    fleet = dataclasses.replace(plan, job_id="fleet-job", max_error_fraction=DEFAULT_MAX_ERROR_FRACTION)
    begin_output(fleet)  # what submit does
    manifest = tasks._finish_job(fleet, [ShardOutcome.from_result_dict(s) for s in shards])
    assert manifest["status"] == "failed" and manifest["mode"] == "celery"
    assert manifest["error"].endswith("commonest error (7 rows): missing text field 'text'")
    assert not success_marker_exists(plan.output_url, plan.output_options)


def test_openai_batches_keep_their_errors_in_the_error_file() -> None:
    batch = JobSpec.from_file(EXAMPLES / "openai_batch.toml").to_plan("b", read_only=True)
    assert batch.max_error_fraction == 1.0
    harness = JobSpec.from_file(EXAMPLES / "harness_requests.toml").to_plan("h", read_only=True)
    assert harness.max_error_fraction == 1.0  # lm-eval reads each request's error itself
    summarize = JobSpec.from_file(EXAMPLES / "summarize.toml").to_plan("s", read_only=True)
    assert summarize.max_error_fraction == DEFAULT_MAX_ERROR_FRACTION and summarize.max_error_rows is None


def test_tokenmill_run_exits_non_zero_naming_the_commonest_error(tmp_path: Path, tiny_model_dir: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/a.jsonl").write_bytes(jsonl_bytes(_rows(bad=10)))
    spec = tmp_path / "job.toml"
    spec.write_text('name = "budget"\n[input]\nurl = "docs/"\nid_field = "id"\n[output]\nurl = "out/"\n'
                    f"{tiny_model_toml(tiny_model_dir)}[sampling]\nmax_tokens = 2\n")
    result = CliRunner().invoke(app, ["run", str(spec), "--no-progress", "--show", "0"])
    assert result.exit_code == 1, result.output
    flat = " ".join(result.output.split())
    assert "failed" in flat and "commonest error (10 rows): missing text field 'text'" in flat
    assert not (tmp_path / "out/_SUCCESS").exists() and list((tmp_path / "out").glob("part-*.parquet"))
