"""The shard driver against a fake engine (no model): rows in == rows out, error rows,
engine faults, cancelling, spooling order and the bound on held rows, in milliseconds."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from fake_engine import FakeEngine
from pipeline_support import jsonl_bytes, local_put, make_plan, write_uniform_shards

import pipeline.part_sink as part_sink
from connectors import list_shards, read_parts
from jobs.kinds import KIND_NAMES  # the kinds this process holds: every module of jobs/kinds/
from pipeline.part_sink import PartSink
from pipeline.plan import JobPlan
from pipeline.shard_driver import ShardDriver
from pipeline.shard_outcome import ShardOutcome, ShardState

MODEL = Path("fake-model")


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "in").mkdir()
    return tmp_path / "in", tmp_path / "out"


def _budgets_shard(put, name: str, budgets: list[int], prefix: str = "") -> list[str]:
    """One JSONL shard whose rows ask for ``budgets[i]`` tokens each (rows finish out of order)."""
    rows = [{"id": f"{prefix}{name}-{i}", "text": f"doc {i} of {name}", "lang": "en", "sampling": {"max_tokens": b}}
            for i, b in enumerate(budgets)]
    put(f"{name}.jsonl", jsonl_bytes(rows))
    return [r["id"] for r in rows]


def _run(engine: FakeEngine, plan, **kwargs) -> list[ShardOutcome]:
    return list(ShardDriver(engine, plan, **kwargs).run(list_shards(plan.input_url)))


def test_rows_in_equal_rows_out_in_input_order_and_a_rerun_skips(dirs) -> None:
    inp, out = dirs
    put = local_put(inp)
    ids = {name: _budgets_shard(put, name, [(7 * i + len(name)) % 9 + 1 for i in range(11)])
           for name in ("a", "b", "c")}
    plan = make_plan(str(inp), str(out), MODEL, sampling_field="sampling")
    events: list[tuple[int, str]] = []
    engine = FakeEngine()
    outcomes = _run(engine, plan, on_progress=lambda p: events.append((p.index, p.state)))

    assert [(o.index, o.state, o.counts.rows, o.counts.errors) for o in outcomes] == [
        (i, ShardState.DONE, 11, 0) for i in range(3)]
    for shard, name in zip(list_shards(plan.input_url), ("a", "b", "c"), strict=True):
        part = pq.read_table(out / f"part-{shard.part_id}.parquet").to_pylist()
        assert [r["id"] for r in part] == ids[name]  # input order, whatever order rows finished in
        assert [r["output_tokens"] for r in part] == [(7 * i + len(name)) % 9 + 1 for i in range(11)]
        assert sum(r["output_tokens"] for r in part) == outcomes[shard.index].counts.output_tokens
        assert all(r["error"] is None and r["finish_reason"] == "length" and r["lang"] == "en" for r in part)
    assert {(i, "running") for i in range(3)} | {(i, "done") for i in range(3)} == set(events)
    assert not engine.has_unfinished()

    again = _run(FakeEngine(), plan)
    assert [(o.state, o.counts.rows, o.counts.output_tokens) for o in again] == [
        (ShardState.SKIPPED, o.counts.rows, o.counts.output_tokens) for o in outcomes]


def test_bad_rows_become_error_rows(dirs) -> None:
    inp, out = dirs
    rows = [
        {"id": "ok", "text": "fine", "lang": "en"},
        "{not json",
        {"id": "no-lang", "text": "a document without the lang field"},
        {"id": "long", "text": "x" * 300, "lang": "en"},
        {"id": "refused", "text": "needs too many blocks", "lang": "en"},
        {"id": "broken", "text": "engine bug", "lang": "en"},
        {"id": "bad-sampling", "text": "fine too", "lang": "en", "sampling": {"temprature": 0.5}},
        {"id": "ok2", "text": "also fine", "lang": "en"},
    ]
    local_put(inp)("rows.jsonl", jsonl_bytes(rows))
    plan = make_plan(str(inp), str(out), MODEL, sampling_field="sampling")
    engine = FakeEngine(max_model_len=256)
    engine.refuse = {"needs too many": "needs 9 KV blocks (300 tokens) but the cache has 8 blocks in all; it can never run",
                     "engine bug": RuntimeError("boom")}
    (outcome,) = _run(engine, plan)

    table = read_parts(plan.output_url)
    assert table.column("id").to_pylist() == ["ok", "rows.jsonl:1", "no-lang", "long", "refused", "broken",
                                               "bad-sampling", "ok2"]
    errors = dict(zip(table.column("id").to_pylist(), table.column("error").to_pylist(), strict=True))
    assert errors["ok"] is None and errors["ok2"] is None
    assert "malformed JSON" in errors["rows.jsonl:1"]
    assert errors["no-lang"] == "row 2: template field 'lang' missing"
    long_tokens = len(engine.apply_chat_template([
        {"role": "system", "content": plan.prompt.system}, {"role": "user", "content": "Document (en): " + "x" * 300}]))
    assert errors["long"] == f"row 3: prompt is {long_tokens} tokens, the model's context is 256 tokens"
    assert errors["refused"] == "row 4: needs 9 KV blocks (300 tokens) but the cache has 8 blocks in all; it can never run"
    assert errors["broken"] == "row 5: cannot queue the request: RuntimeError: boom"
    assert errors["bad-sampling"] == "row 6: invalid sampling parameters: unknown sampling parameter(s): temprature"
    rows_out = {r["id"]: r for r in table.to_pylist()}
    assert rows_out["long"]["prompt_tokens"] == long_tokens and rows_out["long"]["finish_reason"] == "error"
    assert (outcome.state, outcome.counts.rows, outcome.counts.errors) == (ShardState.DONE, 8, 6)


def test_truncation_cuts_the_document_to_fit(dirs) -> None:
    inp, out = dirs
    local_put(inp)("long.jsonl", jsonl_bytes([{"id": "long", "text": "word " * 200, "lang": "en"}]))
    plan = make_plan(str(inp), str(out), MODEL, truncate_prompt=True)
    (outcome,) = _run(FakeEngine(max_model_len=256), plan)
    (row,) = read_parts(plan.output_url).to_pylist()
    assert outcome.state == ShardState.DONE and row["error"] is None
    assert 128 <= row["prompt_tokens"] < 256 - 4 and row["output_tokens"] == 4


def test_a_plan_naming_code_instead_of_a_kind_is_refused(dirs) -> None:
    inp, out = dirs
    expected = f"^unknown job kind 'os:system': expected one of {', '.join(KIND_NAMES)}$"
    with pytest.raises(ValueError, match=expected):
        make_plan(str(inp), str(out), MODEL, kind="os:system")
    data = {**make_plan(str(inp), str(out), MODEL).to_dict(), "kind": "os:system"}
    with pytest.raises(ValueError, match=expected):  # as a worker reads it from the broker
        JobPlan.from_dict(data)


def test_engine_fault_fails_the_shards_in_it_and_keeps_serving(dirs, monkeypatch) -> None:
    """A step that raises outside any one request (the engine itself broke) is not the rows'
    fault: the shards with rows in the engine fail with the reason and commit nothing (no
    error rows that a re-run would skip as current); later shards are served; a re-run
    writes every row once. (Moved here from test_pipeline_embedded: it checks the driver only.)"""
    inp, out = dirs
    ids = write_uniform_shards(local_put(inp), count=3, rows=10)
    plan = make_plan(str(inp), str(out), MODEL)
    engine = FakeEngine()
    real_step, calls = engine.step, {"n": 0}

    def flaky_step():
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated kernel crash")
        return real_step()

    monkeypatch.setattr(engine, "step", flaky_step)
    results = list(ShardDriver(engine, plan).run(list_shards(plan.input_url)))
    failed = [r for r in results if r.state == "failed"]
    assert failed and results[-1].state == "done"  # the shard opened after the fault was served
    assert all(r.reason == "engine failed: RuntimeError: simulated kernel crash" and r.transient for r in failed)
    assert not engine.has_unfinished()
    table = read_parts(plan.output_url)
    assert not any(table.column("error").to_pylist())  # no rows blamed for the engine's fault
    assert len(table) == 10 * (3 - len(failed))

    monkeypatch.setattr(engine, "step", real_step)
    again = list(ShardDriver(engine, plan).run(list_shards(plan.input_url)))
    assert sorted(r.state for r in again) == sorted(["done"] * len(failed) + ["skipped"] * (3 - len(failed)))
    out_ids = read_parts(plan.output_url).column("id").to_pylist()
    assert sorted(out_ids) == sorted(ids) and len(out_ids) == len(set(out_ids))


def test_an_engine_fault_rebuilds_the_engine(dirs) -> None:
    """With an ``engine_factory`` the broken engine is emptied and replaced; the shards it held
    fail transiently and the rest run on the new engine."""
    inp, out = dirs
    write_uniform_shards(local_put(inp), count=3, rows=10)
    plan = make_plan(str(inp), str(out), MODEL)
    broken, built = FakeEngine(fail_at_step=3), []

    def rebuild() -> FakeEngine:
        built.append(FakeEngine())
        return built[-1]

    driver = ShardDriver(broken, plan, engine_factory=rebuild, max_queued=12)
    outcomes = list(driver.run(list_shards(plan.input_url)))
    assert [(o.state, o.transient) for o in outcomes] == [(ShardState.FAILED, True)] * 2 + [(ShardState.DONE, False)]
    assert len(built) == 1 and driver.engine is built[0]
    assert not broken.has_unfinished() and not built[0].has_unfinished()
    assert read_parts(plan.output_url).num_rows == 10


def test_cross_shard_feeding_overlaps_shards(dirs) -> None:
    """The next shard's rows enter the engine while the previous shard still decodes;
    with cross_shard=False the engine drains first."""
    inp, out = dirs
    write_uniform_shards(local_put(inp), count=4, rows=5)
    plan = make_plan(str(inp), str(out), MODEL, sampling={"max_tokens": 6, "temperature": 0.0, "ignore_eos": True})
    shards = list_shards(plan.input_url)

    def overlap(cross: bool, output: Path) -> int:
        plan.output_url = str(output)
        events: list[tuple[int, str]] = []
        driver = ShardDriver(FakeEngine(), plan, cross_shard=cross,
                             on_progress=lambda p: events.append((p.index, p.state)))
        outcomes = list(driver.run(shards))
        assert [o.state for o in outcomes] == ["done"] * 4
        starts = [events.index((i, "running")) for i in range(4)]
        ends = [events.index((i, "done")) for i in range(4)]
        return sum(starts[i + 1] < ends[i] for i in range(3))

    assert overlap(True, out / "cross") == 3
    assert overlap(False, out / "drain") == 0


def test_cancel_mid_run_drops_the_open_shards_and_the_rest(dirs) -> None:
    inp, out = dirs
    write_uniform_shards(local_put(inp), count=4, rows=6)
    plan = make_plan(str(inp), str(out), MODEL, sampling={"max_tokens": 5, "temperature": 0.0, "ignore_eos": True})
    seen: list[ShardOutcome] = []
    engine = FakeEngine()
    driver = ShardDriver(engine, plan, on_progress=seen.append,
                         should_stop=lambda: any(p.counts.rows > 0 for p in seen))
    driver.stop_poll.interval_s = 0.0  # asked at every step, not once a second
    outcomes = list(driver.run(list_shards(plan.input_url)))

    assert sorted(o.index for o in outcomes) == [0, 1, 2, 3]
    assert {o.state for o in outcomes} == {ShardState.CANCELLED}
    assert all(o.reason == "job cancelled" for o in outcomes)
    assert not list(out.glob("part-*")) and not engine.has_unfinished()
    assert engine.aborted  # the rows in the engine were aborted, not left to run


def test_spooling_keeps_input_order_and_bounds_held_rows(dirs, monkeypatch) -> None:
    """Row 0 is slow: the rest finish first and wait for it; reading stops at ``max_held``
    rows held, and rows reach the part (and the OpenAI lines) in input order, in several runs."""
    inp, out = dirs
    budgets = [40] + [1] * 199
    ids = _budgets_shard(local_put(inp), "spool", budgets)
    plan = make_plan(str(inp), str(out), MODEL, sampling_field="sampling", openai_output=True)
    monkeypatch.setattr(part_sink, "SPOOL_ROWS", 16)
    waiting: list[int] = []
    real_add = PartSink.add

    def add(self, position, row) -> None:
        real_add(self, position, row)
        waiting.append(len(self.rows))

    monkeypatch.setattr(PartSink, "add", add)
    driver = ShardDriver(FakeEngine(), plan)
    driver.max_held = 48
    (outcome,) = list(driver.run(list_shards(plan.input_url)))

    assert outcome.state == ShardState.DONE and outcome.counts.rows == 200
    (shard,) = list_shards(plan.input_url)
    part = pq.ParquetFile(out / f"part-{shard.part_id}.parquet")
    assert part.read().column("id").to_pylist() == ids
    assert part.num_row_groups > 1  # spooled as it went, not written at the end
    assert max(waiting) <= driver.max_held + driver.read_batch
    lines = [json.loads(x) for x in (out / f"part-{shard.part_id}.jsonl").read_text().splitlines()]
    assert [x["custom_id"] for x in lines] == ids
