"""Checkpoints inside a shard, with the fake engine (no model), on local files and on S3 (moto
and SeaweedFS).

A "kill" here is an exception no handler catches, raised from the progress callback once the
shard has enough rows done: the driver stops where it is, like a worker killed there (its
local part file is gone, only what reached storage stays). The resumed run must take every
committed row from the checkpoint and compute exactly the others; a chunk that is missing,
corrupt, or another plan's or input version's is recomputed, never trusted.
"""

from __future__ import annotations

import hashlib
import io
import json
import types
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fake_engine import FakeEngine
from pipeline_support import Where, jsonl_bytes, make_plan

import pipeline.part_sink as part_sink
from connectors import ShardCheckpoint, filesystem_for, list_shards, read_parts
from connectors.checkpoints import RECORD_NAME
from connectors.parquet_sink import FINGERPRINT_KEY
from pipeline.output_schema import output_schema
from pipeline.shard_driver import ShardDriver
from pipeline.shard_outcome import ShardOutcome, ShardState

MODEL = Path("fake-model")
ROWS = 120


class Killed(BaseException):
    """The worker died here (nothing in the driver catches it)."""


class CountingEngine(FakeEngine):
    """The fake engine, remembering which rows it was asked to compute."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rows: list[int] = []

    def add_request(self, request_id, prompt, params) -> None:
        super().add_request(request_id, prompt, params)
        self.rows.append(int(request_id.split(":")[2].split("#")[0]))


@pytest.fixture(params=["local", "moto", "seaweedfs"])
def where(request, tmp_path: Path) -> Where:
    if request.param == "local":
        (tmp_path / "in").mkdir()
        return Where(str(tmp_path / "in"), str(tmp_path / "out"), {})
    server = request.getfixturevalue("s3_server" if request.param == "moto" else "seaweedfs_server")
    if not server.running:  # a fault test may have left it stopped
        server.start()
    # one bucket per server, a folder per test: SeaweedFS gives each bucket volumes of its own
    # and runs out of them after a few buckets
    # (a server stopped and started again by a fault test is empty)
    bucket = getattr(server, "checkpoint_bucket", None)
    if bucket is None or bucket not in {b["Name"] for b in server.client().list_buckets()["Buckets"]}:
        server.checkpoint_bucket = server.make_bucket()
    root = f"s3://{server.checkpoint_bucket}/{uuid.uuid4().hex[:8]}"
    return Where(f"{root}/in", f"{root}/out", server.storage_options, server.client())


def _shard(where: Where, rows: int = ROWS, name: str = "docs.jsonl") -> list[str]:
    docs = [{"id": f"d{i}", "text": f"document number {i}", "lang": "en"} for i in range(rows)]
    where.put(name, jsonl_bytes(docs))
    return [d["id"] for d in docs]


def _plan(where: Where, **overrides: Any):
    values = dict(storage_options=where.options, checkpoint_rows=20, checkpoint_seconds=0,
                  sampling={"max_tokens": 3, "temperature": 0.0, "ignore_eos": True})
    return make_plan(where.input_url, where.output_url, MODEL, **{**values, **overrides})


def _run(plan, engine: FakeEngine, kill_at: int | None = None, **kwargs: Any) -> list[ShardOutcome]:
    def progress(p: ShardOutcome) -> None:
        if kill_at is not None and p.counts.rows >= kill_at:
            raise Killed

    driver = ShardDriver(engine, plan, on_progress=progress, **kwargs)
    shards = list_shards(plan.input_url, storage_options=plan.storage_options)
    try:
        return list(driver.run(shards))
    except Killed:
        return []


def _checkpoint(plan) -> ShardCheckpoint:
    (ref,) = list_shards(plan.input_url, storage_options=plan.storage_options)
    return ShardCheckpoint(plan.output_url, ref.part_id, plan.part_fingerprint(ref.fingerprint), plan.output_options)


def _committed(plan) -> list[tuple[int, int]]:
    """The (start, end) of every chunk the checkpoint would let a resumed run take."""
    cp = _checkpoint(plan)
    return [(c.entry.start, c.entry.end) for c in cp.load(output_schema(plan), plan.openai_output)]


def _without_latency(table: pa.Table) -> list[dict]:
    return table.drop(["latency_s"]).to_pylist()


def test_a_killed_shard_resumes_after_its_checkpoint_computing_only_the_rest(where: Where) -> None:
    ids = _shard(where)
    plan = _plan(where)
    first = CountingEngine()
    assert _run(plan, first, kill_at=70) == []
    chunks = _committed(plan)
    committed = chunks[-1][1]
    assert [end - start for start, end in chunks] == [20] * len(chunks)  # every 20 rows, in input order
    assert 70 - 20 - 2 * first.config.max_num_seqs <= committed <= 70
    # a half-done job: a reader sees no part, and chunks only under the hidden _checkpoints/
    assert not [n for n in where.files(where.output_url) if n.startswith("part-")]
    assert read_parts(plan.output_url, plan.output_options).num_rows == 0

    second = CountingEngine()
    (outcome,) = _run(plan, second)
    assert (outcome.state, outcome.counts.rows, outcome.rows_resumed) == (ShardState.DONE, ROWS, committed)
    assert sorted(second.rows) == list(range(committed, ROWS))  # no committed row computed again
    table = read_parts(plan.output_url, plan.output_options)
    assert table.column("id").to_pylist() == ids  # every row once, in input order
    assert where.files(_checkpoint(plan).url) == []  # removed once the part is committed

    clean = replace(plan, output_url=where.output_url + "-clean", checkpoint_rows=0)
    (plain,) = _run(clean, CountingEngine())
    assert plain.counts == outcome.counts
    assert _without_latency(read_parts(clean.output_url, clean.output_options)) == _without_latency(table)


def _chunk_files(where: Where, plan) -> list[str]:
    url = _checkpoint(plan).url
    return [n for n in where.files(url) if n.startswith("chunk-") and n.endswith(".parquet")]


def _rewrite(where: Where, plan, name: str, data: bytes) -> None:
    fs, path = filesystem_for(f"{_checkpoint(plan).url}/{name}", where.options)
    fs.pipe_file(path, data)


def test_a_corrupt_a_missing_and_a_foreign_chunk_are_recomputed(where: Where) -> None:
    _shard(where)
    plan = _plan(where)
    _run(plan, CountingEngine(), kill_at=100)
    names = _chunk_files(where, plan)
    assert len(names) >= 4

    # chunk 3: another plan's rows for the same range, record patched to match its bytes, so
    # only the chunk's own footer tells: trusted up to chunk 2
    fs, base = filesystem_for(_checkpoint(plan).url, where.options)
    table = pq.read_table(io.BytesIO(fs.cat_file(f"{base}/{names[2]}")))
    buf = io.BytesIO()
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, FINGERPRINT_KEY: b"another plan"}), buf)
    _rewrite(where, plan, names[2], buf.getvalue())
    record = json.loads(fs.cat_file(f"{base}/{RECORD_NAME}"))
    record["chunks"][2].update(size=len(buf.getvalue()), sha256=hashlib.sha256(buf.getvalue()).hexdigest())
    _rewrite(where, plan, RECORD_NAME, json.dumps(record).encode())
    assert _committed(plan)[-1] == (20, 40)

    _rewrite(where, plan, names[1], b"PAR1 garbage")  # chunk 2 corrupt: trusted up to chunk 1
    assert _committed(plan) == [(0, 20)]
    fs.rm_file(f"{base}/{names[0]}")  # chunk 1 missing: nothing trusted
    assert _committed(plan) == []

    engine = CountingEngine()
    (outcome,) = _run(plan, engine)
    assert outcome.rows_resumed == 0 and sorted(engine.rows) == list(range(ROWS))


def test_a_checkpoint_of_another_plan_or_input_version_is_not_taken(where: Where) -> None:
    _shard(where)
    plan = _plan(where)
    _run(plan, CountingEngine(), kill_at=60)
    assert _committed(plan)
    other = replace(plan, sampling={**plan.sampling, "max_tokens": 2})  # another plan, same part
    engine = CountingEngine()
    assert _run(other, engine, kill_at=60) == []  # writes its own checkpoint over plan's
    assert engine.rows[:20] == list(range(20))  # started from row 0

    _shard(where, name="docs.jsonl", rows=ROWS + 1)  # a new input version
    engine = CountingEngine()
    (outcome,) = _run(other, engine)
    assert outcome.rows_resumed == 0 and sorted(engine.rows) == list(range(ROWS + 1))


def test_openai_lines_survive_a_resume(where: Where) -> None:
    ids = _shard(where)
    plan = _plan(where, openai_output=True)
    _run(plan, CountingEngine(), kill_at=50)
    (outcome,) = _run(plan, CountingEngine())
    assert outcome.rows_resumed >= 20
    (ref,) = list_shards(plan.input_url, storage_options=plan.storage_options)
    fs, path = filesystem_for(f"{plan.output_url}/part-{ref.part_id}.jsonl", where.options)
    lines = [json.loads(x) for x in fs.cat_file(path).decode().splitlines()]
    assert [x["custom_id"] for x in lines] == ids


def test_a_hand_back_checkpoints_every_finished_row_first(where: Where) -> None:
    """The drain path: a stop with ``hand_back`` saves the finished prefix before dropping the shard."""
    _shard(where)
    plan = _plan(where, checkpoint_rows=1000)  # no checkpoint would come from the row count
    seen: list[ShardOutcome] = []
    engine = CountingEngine()
    driver = ShardDriver(engine, plan, on_progress=seen.append, hand_back=lambda: True,
                         should_stop=lambda: any(p.counts.rows >= 30 for p in seen))
    driver.stop_poll.interval_s = 0.0  # asked at every step, not once a second
    (outcome,) = list(driver.run(list_shards(plan.input_url, storage_options=plan.storage_options)))
    assert outcome.state == ShardState.CANCELLED
    saved = _committed(plan)[-1][1]
    assert saved >= 30 and outcome.reason == f"handed back, its first {saved} rows checkpointed"

    again = CountingEngine()
    (done,) = _run(plan, again)
    assert done.rows_resumed == saved and sorted(again.rows) == list(range(saved, ROWS))
    recomputed = set(engine.rows) & set(again.rows)
    assert len(recomputed) <= 2 * engine.config.max_num_seqs  # only the rows that were in flight


def test_checkpoints_by_time_and_none_when_off(where: Where, monkeypatch) -> None:
    _shard(where)
    clock = iter(range(10**6))
    monkeypatch.setattr(part_sink, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    timed = _plan(where, checkpoint_rows=0, checkpoint_seconds=50)  # 50 "seconds" = 50 clock reads
    _run(timed, CountingEngine(), kill_at=100)
    assert len(_committed(timed)) >= 2

    off = replace(_plan(where, checkpoint_rows=0, checkpoint_seconds=0), output_url=where.output_url + "-off")
    _run(off, CountingEngine(), kill_at=100)
    assert where.files(off.output_url) == []
    engine = CountingEngine()
    (outcome,) = _run(off, engine)
    assert outcome.rows_resumed == 0 and len(engine.rows) == ROWS


def test_the_spec_sets_the_interval_and_refuses_a_negative_one(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from jobs.spec import JobSpec
    from pipeline.plan import DEFAULT_CHECKPOINT_ROWS, DEFAULT_CHECKPOINT_SECONDS

    def spec(**output: Any) -> JobSpec:
        return JobSpec.from_dict({"name": "ckpt", "input": {"url": "in/"}, "output": {"url": "out/", **output}},
                                 base_dir=tmp_path)

    plan = spec().to_plan("j")
    assert (plan.checkpoint_rows, plan.checkpoint_seconds) == (DEFAULT_CHECKPOINT_ROWS, DEFAULT_CHECKPOINT_SECONDS)
    assert plan.checkpoints and plan.part_fingerprint("x") == replace(plan, checkpoint_rows=7).part_fingerprint("x")
    off = spec(checkpoint_rows=0, checkpoint_seconds=0).to_plan("j")
    assert not off.checkpoints
    with pytest.raises(ValidationError, match="checkpoint_seconds"):
        spec(checkpoint_seconds=-1)


def test_a_checkpoint_that_cannot_be_written_costs_only_the_checkpoint(tmp_path: Path, monkeypatch) -> None:
    """The store refuses every chunk: the shard still ends done with every row, and a failed
    checkpoint is tried again only an interval later, not at every finished row."""
    (tmp_path / "in").mkdir()
    where = Where(str(tmp_path / "in"), str(tmp_path / "out"), {})
    ids = _shard(where)
    attempts: list[int] = []

    def refuse(self, table, start, lines=None):
        attempts.append(start + table.num_rows)
        raise ConnectionError("injected: the object store is down")

    monkeypatch.setattr(ShardCheckpoint, "save", refuse)
    (outcome,) = _run(_plan(where), CountingEngine())
    assert outcome.state == ShardState.DONE and read_parts(where.output_url).column("id").to_pylist() == ids
    assert attempts == list(range(20, ROWS + 1, 20))  # each chunk tried once per 20 rows, not per row
