"""A sparse million-row shard in bounded memory: the first row is a long generation and every
other row is empty. Empty rows are error rows that never enter the engine, and rows reach
the part only in input order, so without a bound on the rows a shard holds every row read
after the first would wait in memory for it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from pipeline_support import make_plan

from connectors import list_shards, read_manifest

REPO = Path(__file__).resolve().parents[2]
ROWS = 1_000_000
LONG = 600  # output tokens of the first row (ignore_eos): the engine steps 600 times for it
# Peak RSS over the size before the job. Measured 2026-11-23 (2 cores, AVX2): see the README's
# reliability table; about 4x headroom over the measured figure, far below the ~1 GiB the
# shard's rows take in memory when they are all held.
PEAK_LIMIT_MIB = 64

_MEASURE = """
import json, sys
from pipeline.engine_cache import get_engine
from pipeline.job_runner import run_embedded
from pipeline.plan import JobPlan

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024

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


def test_a_sparse_million_row_shard_behind_one_long_generation_runs_in_bounded_memory(
    tmp_path: Path, tiny_model_dir
) -> None:
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    with open(inp / "sparse.jsonl", "w") as f:
        f.write('{"id": "r0000000", "text": "a document that asks for a long answer"}\n')
        for i in range(1, ROWS):
            f.write(f'{{"id": "r{i:07d}", "text": ""}}\n')
    plan = make_plan(str(inp), str(out), tiny_model_dir, job_id="sparse", passthrough_fields=[],
                     prompt={"system": "Answer at length.", "user_template": "{text}"},
                     sampling={"max_tokens": LONG, "temperature": 0.0, "ignore_eos": True})
    plan = type(plan).from_dict(plan.to_dict())  # prompt as a PromptPlan

    done = subprocess.run([sys.executable, "-c", _MEASURE, json.dumps(plan.to_dict())], cwd=REPO,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    print("sparse shard memory:", measured)

    assert measured["totals"]["rows"] == ROWS and measured["totals"]["errors"] == ROWS - 1
    assert measured["peak_mib"] - measured["before_mib"] < PEAK_LIMIT_MIB, measured
    (shard,) = list_shards(plan.input_url)
    part = pq.read_table(out / f"part-{shard.part_id}.parquet", columns=["id", "error", "output_tokens"])
    assert part.column("id").to_pylist() == [f"r{i:07d}" for i in range(ROWS)]
    assert part.column("output_tokens")[0].as_py() == LONG and part.column("error")[0].as_py() is None
    manifest = read_manifest(plan.output_url)  # all rows but one erred: the error budget fails the job
    assert manifest["status"] == "failed" and manifest["shards"][0]["status"] == "done"
    assert f"commonest error ({ROWS - 1} rows): " in manifest["error"]
