"""Huge inputs through the embedded pipeline: a 50 MB document in each input format and
deeply nested JSON become error rows while their neighbours are processed, and a
million-row shard runs in bounded memory (its part is written as rows finish)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pipeline_support import csv_bytes, jsonl_bytes, make_plan, parquet_bytes

from connectors import list_shards, read_manifest, read_parts
from pipeline.job_runner import run_embedded

REPO = Path(__file__).resolve().parents[2]
BIG = "word " * 10_000_000  # 50,000,000 bytes
LINE_LIMIT = 4 * 8_000_000 + (1 << 20)  # the readers' line and CSV field limit for the default 8 MB documents


def test_a_50mb_document_is_an_error_row_in_every_format(tmp_path: Path, tiny_model_dir) -> None:
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    deep = {"id": "j-deep", "text": "nested", "lang": "en", "meta": json.loads("[" * 500 + "]" * 500)}
    jsonl = jsonl_bytes([{"id": "j-a", "text": "first", "lang": "en"}, {"id": "j-big", "text": BIG, "lang": "en"},
                         {"id": "j-b", "text": "last", "lang": "en"}])
    jsonl += b'{"id": "j-deeper", "text": "x", "lang": "en", "meta": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    jsonl += jsonl_bytes([deep])
    (inp / "a.jsonl").write_bytes(jsonl)
    (inp / "b.csv").write_bytes(csv_bytes(["id", "text", "lang"], [["c-a", "first", "en"], ["c-big", BIG, "en"],
                                                                   ["c-b", "last", "en"]]))
    (inp / "c.parquet").write_bytes(parquet_bytes(pa.table({
        "id": ["p-a", "p-big", "p-b"], "text": ["first", BIG, "last"], "lang": ["en"] * 3})))
    plan = make_plan(str(inp), str(out), tiny_model_dir, passthrough_fields=["lang", "meta"])

    manifest = run_embedded(plan, progress=False)

    assert manifest["totals"]["shards_done"] == 3 and manifest["totals"]["rows"] == 11
    rows = {r["id"]: r for r in read_parts(plan.output_url).to_pylist()}
    big_line = len(json.dumps({"id": "j-big", "text": BIG, "lang": "en"})) + 1
    errors = {i: r["error"] for i, r in rows.items() if r["error"]}
    assert errors == {
        "a.jsonl:1": f"row 1: line is {big_line} bytes, over the {LINE_LIMIT}-byte line limit",
        "a.jsonl:3": "row 3: malformed JSON: nesting too deep",
        "b.csv:1": f"row 1: a field is over the {LINE_LIMIT}-byte CSV field limit",
        "p-big": "row 1: document is 50000000 bytes, over the 8000000-byte limit",
    }
    for i in ("j-a", "j-b", "j-deep", "c-a", "c-b", "p-a", "p-b"):
        assert rows[i]["output_tokens"] == 4, rows[i]
    assert json.loads(rows["j-deep"]["meta"]) == deep["meta"]
    # a row that could not be parsed has its file and row as id; a parsed one (Parquet) keeps its own
    assert rows["b.csv:1"]["output"] is None and rows["p-big"]["output"] is None


_MEASURE = """
import json, sys
from pipeline.engine_cache import get_engine
from pipeline.job_runner import run_embedded
from pipeline.plan import JobPlan

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) // 1024

plan = JobPlan.from_dict(json.loads(sys.argv[1]))
get_engine(plan.engine_settings)
# A one-row job first, so the modules a job imports on first use (the kinds, Parquet writing, the
# error budget's reader) and the engine's first steps are in `before`: what is measured is what
# the rows cost, not the process's one-time code (about 27 MiB of imports on an Intel Xeon).
import dataclasses, pathlib, tempfile
warm = pathlib.Path(tempfile.mkdtemp(prefix="tm-warm-"))
(warm / "in").mkdir()
(warm / "in" / "one.jsonl").write_text('{"id": "w", "text": "warm up", "lang": "en"}\\n')
run_embedded(dataclasses.replace(plan, job_id="warm", input_url=str(warm / "in"), output_url=str(warm / "out")),
             progress=False)
before = rss("VmRSS")
manifest = run_embedded(plan, progress=False)
print(json.dumps({"before_mib": before, "peak_mib": rss("VmHWM"), "totals": manifest["totals"]}))
"""


def test_a_million_row_shard_runs_in_bounded_memory(tmp_path: Path, tiny_model_dir) -> None:
    """One shard of 1,000,000 rows (one in 1,000 a real document, the rest empty: error rows that
    cost no engine time). Its output is about 100 MB as Python rows; the worker's peak memory
    stays within 64 MiB of its size before the job (15 MiB measured, see the README), and the
    part keeps input order."""
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    n = 1_000_000
    with open(inp / "big.jsonl", "w") as f:
        for i in range(n):
            text = f"document number {i} about rivers" if i % 1000 == 0 else ""
            f.write(f'{{"id": "r{i:07d}", "text": "{text}", "lang": "en"}}\n')
    plan = make_plan(str(inp), str(out), tiny_model_dir, job_id="million",
                     sampling={"max_tokens": 2, "temperature": 0.0, "ignore_eos": True})

    done = subprocess.run([sys.executable, "-c", _MEASURE, json.dumps(plan.to_dict())], cwd=REPO,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])

    assert measured["totals"]["rows"] == n and measured["totals"]["errors"] == n - n // 1000
    assert measured["peak_mib"] - measured["before_mib"] < 64, measured
    (shard,) = list_shards(plan.input_url)
    part = pq.read_table(out / f"part-{shard.part_id}.parquet", columns=["id", "error", "output_tokens"])
    assert part.column("id").to_pylist() == [f"r{i:07d}" for i in range(n)]
    assert part.column("output_tokens").to_pylist()[::1000] == [2] * (n // 1000)
    manifest = read_manifest(plan.output_url)  # 99.9% error rows: the error budget fails the job,
    assert manifest["status"] == "failed" and manifest["shards"][0]["status"] == "done"  # not its shard
    assert f"commonest error ({n - n // 1000} rows): " in manifest["error"]
