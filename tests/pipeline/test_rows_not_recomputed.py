"""Rows that did not change are not computed again (issue 28, part 2).

- Across runs: a re-run of a changed shard takes every row whose content key (prompt ids,
  sampling, model, kind) is in the previous part and computes only the others; the rows taken
  are byte-identical to the previous part's.
- Within a run: rows with identical prompt ids and sampling are computed once and fanned
  out, each with its own id; only when that is the same computation (greedy or seeded).

The fake engine (no model) counts the rows it computes; one test runs the tiny model on S3.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fake_engine import FakeEngine
from pipeline_support import Where, jsonl_bytes, make_plan, tiny_engine
from test_checkpoints import CountingEngine

from connectors import list_shards, part_name, read_manifest, read_parts
from pipeline.job_runner import run_embedded
from pipeline.shard_driver import ShardDriver
from pipeline.shard_outcome import ShardOutcome, ShardState

MODEL = Path("fake-model")


def _docs(count: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"id": f"d{i}", "text": f"document number {i}", "lang": "en"} for i in range(start, start + count)]


def _run(plan, engine: FakeEngine, **kwargs: Any) -> list[ShardOutcome]:
    shards = list_shards(plan.input_url, storage_options=plan.storage_options)
    return list(ShardDriver(engine, plan, **kwargs).run(shards))


def test_a_rerun_after_appending_1_percent_computes_only_the_new_and_changed_rows(where: Where) -> None:
    docs = _docs(10_000)
    where.put("docs.jsonl", jsonl_bytes(docs))
    plan = make_plan(where.input_url, where.output_url, MODEL, storage_options=where.options,
                     sampling={"max_tokens": 2, "temperature": 0.0, "ignore_eos": True})
    first = CountingEngine(max_num_seqs=64)
    (outcome,) = _run(plan, first)
    assert outcome.state == ShardState.DONE and len(first.rows) == 10_000
    before = read_parts(plan.output_url, plan.output_options)

    docs[5]["text"] = "an edited document"  # one row changed in place ...
    docs += _docs(100, start=10_000)  # ... and 1% appended
    where.put("docs.jsonl", jsonl_bytes(docs))
    second = CountingEngine(max_num_seqs=64)
    (outcome,) = _run(plan, second)
    assert outcome.state == ShardState.DONE and outcome.counts.rows == 10_100
    assert sorted(second.rows) == [5, *range(10_000, 10_100)]  # the appended and the edited rows, nothing else
    assert outcome.rows_reused == 9_999
    after = read_parts(plan.output_url, plan.output_options)
    assert after.column("id").to_pylist() == [d["id"] for d in docs]
    unchanged = [i for i in range(10_000) if i != 5]
    assert after.take(unchanged).equals(before.take(unchanged))  # every column, latency too
    assert after.column("content_key")[5].as_py() != before.column("content_key")[5].as_py()


def test_duplicate_prompts_are_computed_once_and_every_row_keeps_its_id(where: Where) -> None:
    """Three shards of 30 rows over 7 distinct documents: 7 computed, 90 written. With
    unseeded sampling nothing is shared; with a per-row seed, rows share only with their seed."""
    ids = []
    for s in range(3):
        rows = [{"id": f"s{s}-r{r}", "text": f"document {(s * 30 + r) % 7}", "lang": "en", "seed": r % 2}
                for r in range(30)]
        where.put(f"shard-{s}.jsonl", jsonl_bytes(rows))
        ids += [r["id"] for r in rows]
    plan = make_plan(where.input_url, where.output_url, MODEL, storage_options=where.options,
                     sampling={"max_tokens": 5, "temperature": 0.0, "ignore_eos": True})
    engine = CountingEngine()
    outcomes = _run(plan, engine)
    assert [o.state for o in outcomes] == [ShardState.DONE] * 3
    assert len(engine.rows) == 7 and sum(o.rows_shared for o in outcomes) == 83
    parts = [part_name(s.part_id) for s in list_shards(plan.input_url, storage_options=plan.storage_options)]
    table = read_parts(plan.output_url, plan.output_options, parts=parts)
    assert table.column("id").to_pylist() == ids  # every row present with its own id, in input order
    by_text: dict[str, set[str]] = {}
    for i, out in zip(range(90), table.column("output").to_pylist(), strict=True):
        by_text.setdefault(f"document {i % 7}", set()).add(out)
    assert all(len(outs) == 1 for outs in by_text.values()) and len(by_text) == 7

    unseeded = replace(plan, output_url=where.output_url + "-sampled",
                       sampling={"max_tokens": 5, "temperature": 0.8, "ignore_eos": True})
    engine = CountingEngine()
    outcomes = _run(unseeded, engine)
    assert len(engine.rows) == 90 and sum(o.rows_shared for o in outcomes) == 0

    seeded = replace(unseeded, output_url=where.output_url + "-seeded", sampling_field="seeding")
    for s in range(3):  # a per-row seed: rows share a result only with the same seed
        rows = [{"id": f"s{s}-r{r}", "text": f"document {(s * 30 + r) % 7}", "lang": "en",
                 "seeding": {"seed": r % 2}} for r in range(30)]
        where.put(f"shard-{s}.jsonl", jsonl_bytes(rows))
    engine = CountingEngine()
    outcomes = _run(seeded, engine)
    assert len(engine.rows) == 14 and sum(o.rows_shared for o in outcomes) == 76


def test_rows_following_a_row_of_a_failed_shard_are_computed_anyway(tmp_path: Path) -> None:
    """Shard b holds only copies of shard a's rows. The engine dies while a's rows run: a fails
    (transiently), and b's rows, which were waiting for them, go to the new engine."""
    where = Where(str(tmp_path / "in"), str(tmp_path / "out"), {})
    (tmp_path / "in").mkdir()
    where.put("a.jsonl", jsonl_bytes(_docs(6)))
    where.put("b.jsonl", jsonl_bytes([{**d, "id": f"b-{d['id']}"} for d in _docs(6)]))
    plan = make_plan(where.input_url, where.output_url, MODEL)
    broken, built = CountingEngine(fail_at_step=1), []

    def rebuild() -> FakeEngine:
        built.append(CountingEngine())
        return built[-1]

    outcomes = _run(plan, broken, engine_factory=rebuild, max_queued=32)
    assert [(o.state, o.transient) for o in outcomes] == [(ShardState.FAILED, True), (ShardState.DONE, False)]
    assert broken.rows == list(range(6)) and sorted(built[0].rows) == list(range(6))  # b's rows, computed
    assert read_parts(plan.output_url).column("id").to_pylist() == [f"b-d{i}" for i in range(6)]


def test_a_rerun_on_the_tiny_model_and_s3_takes_the_unchanged_rows(s3_server, s3_bucket, tiny_model_dir) -> None:
    """The real engine, run_embedded, moto S3: the second run's rows of the first input version
    are the first run's, byte for byte; the manifest counts them."""
    client = s3_server.client()
    docs = _docs(40)
    client.put_object(Bucket=s3_bucket, Key="nightly/in/docs.jsonl", Body=jsonl_bytes(docs))
    plan = make_plan(f"s3://{s3_bucket}/nightly/in/", f"s3://{s3_bucket}/nightly/out", tiny_model_dir,
                     storage_options=s3_server.storage_options)
    assert run_embedded(plan, progress=False)["status"] == "succeeded"
    before = read_parts(plan.output_url, plan.output_options)
    client.put_object(Bucket=s3_bucket, Key="nightly/in/docs.jsonl", Body=jsonl_bytes(docs + _docs(4, start=40)))
    manifest = run_embedded(plan, progress=False)
    (shard,) = manifest["shards"]
    assert (shard["status"], shard["rows"], shard["rows_reused"]) == ("done", 44, 40)
    after = read_parts(plan.output_url, plan.output_options)
    assert after.slice(0, 40).equals(before)
    assert read_manifest(plan.output_url, plan.output_options)["totals"]["rows"] == 44


def test_nothing_is_taken_from_a_part_of_another_prompt_sampling_or_model(where: Where) -> None:
    where.put("docs.jsonl", jsonl_bytes(_docs(30)))
    plan = make_plan(where.input_url, where.output_url, MODEL, storage_options=where.options)
    _run(plan, CountingEngine())
    where.put("docs.jsonl", jsonl_bytes(_docs(31)))  # the input changed: the part is not current
    others = [
        replace(plan, prompt=replace(plan.prompt, system="Summarize in French.")),
        replace(plan, sampling={**plan.sampling, "max_tokens": 3}),
        replace(plan, engine_settings={**plan.engine_settings, "model": "another-model"}),
    ]
    for other in others:
        engine = CountingEngine()
        (outcome,) = _run(other, engine)
        assert outcome.rows_reused == 0 and len(engine.rows) == 31  # every row computed
    engine = CountingEngine()
    (outcome,) = _run(plan, engine)  # the last run's part is the model's: nothing from it either
    assert outcome.rows_reused == 0 and len(engine.rows) == 31


def test_a_row_moved_to_another_file_is_taken_from_the_part_it_sat_in(where: Where) -> None:
    where.put("a.jsonl", jsonl_bytes(_docs(20)))
    where.put("b.jsonl", jsonl_bytes(_docs(20, start=20)))
    plan = make_plan(where.input_url, where.output_url, MODEL, storage_options=where.options,
                     sampling={"max_tokens": 2, "temperature": 0.0, "ignore_eos": True})
    first = CountingEngine(max_num_seqs=8)
    assert [o.state for o in _run(plan, first)] == [ShardState.DONE, ShardState.DONE]
    before = {r["id"]: r for r in read_parts(plan.output_url, plan.output_options).to_pylist()}

    where.put("a.jsonl", jsonl_bytes(_docs(10)))  # d10..d19 move to a new file, with one new row
    where.put("c.jsonl", jsonl_bytes([*_docs(10, start=10), {"id": "new", "text": "a new document", "lang": "en"}]))
    second = CountingEngine(max_num_seqs=8)
    a, b, c = _run(plan, second)
    assert (a.state, b.state, c.state) == (ShardState.DONE, ShardState.SKIPPED, ShardState.DONE)
    assert (a.rows_reused, c.rows_reused) == (10, 10)
    assert len(second.rows) == 1  # the new row only
    after = {r["id"]: r for r in read_parts(plan.output_url, plan.output_options).to_pylist()}
    for i in range(10, 20):  # the moved rows, byte for byte (their latency too)
        assert after[f"d{i}"] == before[f"d{i}"]


@pytest.mark.parametrize(("example", "data"), [("evaluate_loglikelihood.toml", "mmlu_style.jsonl"),
                                               ("perplexity.toml", "perplexity.jsonl"),
                                               ("harness_requests.toml", "harness_requests.jsonl")])
def test_a_rerun_of_a_scoring_kind_takes_the_unchanged_rows(tmp_path: Path, tiny_model_dir, example: str,
                                                             data: str) -> None:
    """Log-likelihood scoring, perplexity and token requests (issue 41, point 6): their values are
    whole in the part, so an unchanged row is taken, byte for byte, and the kind's row step
    derives the rest again."""
    import tomllib

    from jobs import JobSpec

    examples = Path(__file__).resolve().parents[2] / "examples"
    rows = (examples / "data" / data).read_text().splitlines()[:6]
    values = tomllib.loads((examples / example).read_text())
    values["input"]["url"], values["output"]["url"] = "in/", "out/"
    engine = tiny_engine(tiny_model_dir)  # the settings of the other tests: their cached engine
    values["model"] = {"path": engine.pop("model"), **engine}
    (tmp_path / "in").mkdir()
    (tmp_path / "in/data.jsonl").write_text("\n".join(rows[:-1]) + "\n")
    plan = JobSpec.from_dict(values, base_dir=tmp_path).to_plan("first")
    assert run_embedded(plan, progress=False)["status"] == "succeeded"
    before = read_parts(plan.output_url)
    (tmp_path / "in/data.jsonl").write_text("\n".join(rows) + "\n")  # one row appended
    manifest = run_embedded(plan, progress=False)
    (shard,) = manifest["shards"]
    assert (shard["status"], shard["rows"], shard["rows_reused"]) == ("done", len(rows), len(rows) - 1)
    assert manifest["engine_stats"]["prompt_tokens_computed"] > 0  # the new row was computed
    assert read_parts(plan.output_url).slice(0, len(rows) - 1).equals(before)


def test_a_rerun_of_an_openai_batch_takes_the_unchanged_rows_and_their_lines(tmp_path: Path, tiny_model_dir) -> None:
    """OpenAI lines (issue 41, point 6): a taken row's choices are read back from its part's lines,
    so the line is the same again, but for ``created``."""
    import json
    import tomllib

    from connectors import list_shards, read_part_lines
    from jobs import JobSpec

    examples = Path(__file__).resolve().parents[2] / "examples"
    requests = (examples / "data/batch_input.jsonl").read_text().splitlines()
    values = tomllib.loads((examples / "openai_batch.toml").read_text())
    values["input"]["url"], values["output"]["url"] = "in/batch.jsonl", "out/"
    engine = tiny_engine(tiny_model_dir)  # the settings of the other tests: their cached engine
    values["model"] = {"path": engine.pop("model"), **engine}
    values["sampling"]["max_tokens"] = 4
    (tmp_path / "in").mkdir()

    def run(lines: list[str]) -> tuple[dict, list[dict]]:
        (tmp_path / "in/batch.jsonl").write_text("\n".join(lines) + "\n")
        plan = JobSpec.from_dict(values, base_dir=tmp_path).to_plan("batch")
        manifest = run_embedded(plan, progress=False)
        (shard,) = list_shards(plan.input_url)
        return manifest, read_part_lines(plan.output_url, shard.part_id) or []

    first, before = run(requests[:-1])
    assert first["status"] == "succeeded" and len(before) == len(requests) - 1
    added = json.loads(requests[-1])
    added["custom_id"] = "added"
    second, after = run([*requests[:-1], json.dumps(added)])
    (shard,) = second["shards"]
    assert (shard["rows"], shard["rows_reused"]) == (len(requests), len(requests) - 1)

    def without_created(line: dict) -> dict:
        return {**line, "response": {**line["response"], "body": {**line["response"]["body"], "created": 0}}}

    assert [without_created(x) for x in after[:-1]] == [without_created(x) for x in before]
    assert after[-1]["custom_id"] == "added" and after[-1]["response"]["body"]["choices"]


def test_the_output_wide_lookup_is_bounded_by_the_parts_and_their_lines(tmp_path: Path, monkeypatch) -> None:
    """Over ``OUTPUT_ROWS_BYTES`` the output's parts are not read whole (a moved row is then
    computed); an OpenAI plan's ``.jsonl`` lines are read too, so they count."""
    import dataclasses

    from connectors import list_part_sizes
    from pipeline import previous_rows

    out = tmp_path / "out"
    (out / "_tmp").mkdir(parents=True)
    (out / "part-00000.parquet").write_bytes(b"x" * 10)
    (out / "part-00000.jsonl").write_bytes(b"y" * 5)
    (out / "part-00001.parquet").write_bytes(b"z" * 3)
    (out / "_tmp/part-00002.parquet").write_bytes(b"w" * 100)  # a temporary: not a part
    assert list_part_sizes(str(out)) == {"00000": 10, "00001": 3}
    assert list_part_sizes(str(out), with_lines=True) == {"00000": 15, "00001": 3}

    plan = make_plan(str(tmp_path / "in"), str(out), MODEL)
    loaded: list[str] = []
    monkeypatch.setattr(previous_rows, "_read", lambda plan, part, columns: loaded.append(part))
    monkeypatch.setattr(previous_rows, "OUTPUT_ROWS_BYTES", 14)
    assert previous_rows.load_output_rows(plan) is None and loaded == ["00000", "00001"]  # 13 bytes: read
    loaded.clear()
    lines = dataclasses.replace(plan, openai_output=True)
    assert previous_rows.load_output_rows(lines) is None and loaded == []  # 18 bytes with the lines: not read
