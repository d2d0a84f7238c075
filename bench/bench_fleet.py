"""Fleet cross-shard feeding: one real worker, ``--pool solo`` vs ``--pool threads -c N``.

A solo worker runs one shard task at a time, so its engine drains at every shard
boundary. Under the threads pool the worker holds two shard tasks and its engine
service admits the next shard while the previous one's tail decodes. Same job, same
engine settings, one fresh worker per mode on the local Redis, side by side in one run.
Wall time is from submit to the finalizer's manifest.

    .venv/bin/python bench/bench_fleet.py --shards 24 --rows 8 --max-tokens 24 --modes solo threads:2 threads:4
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_cross_shard import report_ratios, shard_job_arguments, write_shards  # noqa: E402
from fleet_harness import FleetHarness  # noqa: E402

from connectors import read_manifest  # noqa: E402
from pipeline.fleet import wait_for_job  # noqa: E402
from pipeline.plan import JobPlan, PromptPlan  # noqa: E402


def run_mode(pool: str, concurrency: int, args, inp: Path, out: Path) -> dict:
    settings = {"model": args.model, "max_num_seqs": args.max_num_seqs,
                "max_num_batched_tokens": args.max_batched_tokens}
    name = f"{pool}-c{concurrency}"
    with FleetHarness(settings, pool=pool, concurrency=concurrency, logdir=out) as fleet:
        fleet.start(1)
        plan = JobPlan(
            job_id=f"bench-fleet-{name}-{fleet.run}", name="bench", kind="summarize", input_url=str(inp),
            output_url=str(out / name), id_field="id",
            prompt=PromptPlan(system="Summarize the document in one sentence.", user_template="Document:\n{text}"),
            sampling={"max_tokens": args.max_tokens, "temperature": 0.0}, engine_settings=settings,
        )
        t = time.perf_counter()
        job_id = fleet.submit(plan)
        status = wait_for_job(job_id, 3600, poll_s=0.5)
        wall = time.perf_counter() - t
    manifest = read_manifest(plan.output_url)
    (engine,) = manifest["engine_stats"]["worker_engine_stats"].values()
    totals = manifest["totals"]
    return {
        "mode": f"--pool {pool}" + (f" -c {concurrency}" if pool == "threads" else ""),
        "status": status["status"],
        "wall_s": wall,
        "rows": totals["rows"],
        "output_tokens": totals["output_tokens"],
        "output_tok_s": totals["output_tokens"] / wall,
        "rows_s": totals["rows"] / wall,
        "mean_running_seqs": engine["mean_running_seqs"],
        "steps": engine["steps"],
    }


def main() -> None:
    p = shard_job_arguments(__doc__)
    p.add_argument("--modes", nargs="+", default=["solo", "threads:2"],
                   help="worker pools to compare: solo, threads:N (N shard tasks held at once)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        inp, out = Path(tmp) / "in", Path(tmp) / "out"
        inp.mkdir()
        out.mkdir()
        write_shards(inp, args.shards, args.rows, args.seed)
        results = []
        for mode in args.modes:
            pool, _, concurrency = mode.partition(":")
            results.append(run_mode(pool, int(concurrency or 1), args, inp, out))

    print(f"\n{args.shards} shards x {args.rows} rows, one worker, model {args.model}, "
          f"max_tokens {args.max_tokens}, max_num_seqs {args.max_num_seqs}")
    header = f"{'mode':<22}{'status':>11}{'wall s':>9}{'out tok/s':>11}{'rows/s':>9}{'mean running':>14}{'steps':>7}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['mode']:<22}{r['status']:>11}{r['wall_s']:>9.1f}{r['output_tok_s']:>11.1f}{r['rows_s']:>9.2f}"
              f"{r['mean_running_seqs']:>14.2f}{r['steps']:>7}")
    report_ratios(results, args)


if __name__ == "__main__":
    main()
