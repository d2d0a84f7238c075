"""Soak: a 20,000-row job in 40 shards through two real workers on Redis, input and
output on a real S3 server on loopback (moto, as in the tests), short outputs.

Reports rows/s, each worker's resident memory over the run (peak, and at the first and
last quarter of shards done: it must not grow with shards processed), the broker's queue
depth over time, and checks output rows == input rows with unique ids. Writes JSON and a
PNG of queue depth and RSS over time.

    .venv/bin/python bench/soak.py                       # 20,000 rows, 40 shards, SmolLM2, max_tokens 8
    .venv/bin/python bench/soak.py --rows 2000 --shards 8 # smaller
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bench_cross_shard import WORDS  # noqa: E402
from fleet_harness import FleetHarness, rss_mib  # noqa: E402
from s3_server import S3Server  # noqa: E402

from connectors import read_manifest, read_parts  # noqa: E402
from engine.model_registry import DEFAULT_MODEL  # noqa: E402
from pipeline.fleet import wait_for_job  # noqa: E402
from pipeline.plan import JobPlan, PromptPlan  # noqa: E402

INSTRUCTION = (
    "You summarise news notes for a regional newsletter. Read the document and answer with one short "
    "sentence that names who did what. Do not add facts that are not in the document."
)


def write_input(s3, bucket: str, rows: int, shards: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    ids = []
    per_shard = -(-rows // shards)
    for s in range(shards):
        lines = []
        for r in range(s * per_shard, min(rows, (s + 1) * per_shard)):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 24)))
            lines.append(json.dumps({"id": f"doc-{r:07d}", "text": text}))
            ids.append(f"doc-{r:07d}")
        s3.put_object(Bucket=bucket, Key=f"in/shard-{s:04d}.jsonl", Body=("\n".join(lines) + "\n").encode())
    return ids


def quartile_rss(samples, shards: int) -> tuple[list[float], list[float]]:
    """Mean RSS per worker while the first quarter of shards completed, and over the last quarter."""
    first = [s.rss_mib for s in samples if 0 < s.shards_done <= shards // 4]
    last = [s.rss_mib for s in samples if s.shards_done >= shards - shards // 4]

    def mean(rows: list[list[float]]) -> list[float]:
        return [round(sum(col) / len(col), 1) for col in zip(*rows, strict=True)] if rows else []

    return mean(first), mean(last)


def plot(samples, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t for s in samples]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    ax1.plot(t, [s.queued for s in samples], label="waiting in queue")
    ax1.plot(t, [s.unacked for s in samples], label="delivered, unacked")
    ax1.set_ylabel("messages")
    ax1.legend()
    for w in range(len(samples[0].rss_mib)):
        ax2.plot(t, [s.rss_mib[w] for s in samples], label=f"worker {w}")
    ax2.set_ylabel("RSS MiB")
    ax2.set_xlabel("seconds since submit")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--shards", type=int, default=40)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("bench/published"), help="where the JSON and PNG go")
    args = p.parse_args()

    settings = {"model": args.model, "max_num_seqs": args.max_num_seqs, "num_threads": 1}
    with tempfile.TemporaryDirectory() as tmp, S3Server() as s3_server:
        bucket = s3_server.make_bucket()
        ids = write_input(s3_server.client(), bucket, args.rows, args.shards, args.seed)
        s3_env = {"TOKENMILL_S3_ENDPOINT_URL": s3_server.endpoint_url, "AWS_ACCESS_KEY_ID": "testing",
                  "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
        with FleetHarness(settings, extra_env=s3_env, logdir=Path(tmp)) as fleet:
            fleet.start(args.workers)
            started_rss = [rss_mib(proc.pid) for proc in fleet.procs]
            plan = JobPlan(
                job_id=f"soak-{fleet.run}", name="soak", kind="summarize", input_url=f"s3://{bucket}/in/",
                output_url=f"s3://{bucket}/out", id_field="id",
                prompt=PromptPlan(system=INSTRUCTION, user_template="Document:\n{text}"),
                sampling={"max_tokens": args.max_tokens, "temperature": 0.0}, engine_settings=settings,
            )
            t = time.perf_counter()
            job_id = fleet.submit(plan)
            fleet.sample_every(2.0, job_id)
            status = wait_for_job(job_id, 6 * 3600, poll_s=1.0)
            wall = time.perf_counter() - t
            peak = fleet.peak_rss_mib()
            fleet.stop()
        out_ids = read_parts(plan.output_url, storage_options=s3_server.storage_options).column("id").to_pylist()
        manifest = read_manifest(plan.output_url, storage_options=s3_server.storage_options)

    first_q, last_q = quartile_rss(fleet.samples, args.shards)
    result = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "status": status["status"],
        "wall_s": round(wall, 1),
        "rows_in": len(ids),
        "rows_out": len(out_ids),
        "unique_ids_out": len(set(out_ids)),
        "ids_match": sorted(out_ids) == sorted(ids),
        "row_errors": manifest["totals"]["errors"],
        "rows_per_s": round(len(out_ids) / wall, 2),
        "output_tokens": manifest["totals"]["output_tokens"],
        "prefix_cache_hit_tokens": manifest["totals"]["cached_prompt_tokens"],
        "prompt_tokens": manifest["totals"]["prompt_tokens"],
        "rss_before_job_mib": [round(x, 1) for x in started_rss],
        "peak_rss_mib": [round(x, 1) for x in peak],
        "rss_first_quarter_mib": first_q,
        "rss_last_quarter_mib": last_q,
        "max_queue_depth": max(s.queued for s in fleet.samples),
        "queue_depth": [(round(s.t), s.queued, s.unacked, s.shards_done) for s in fleet.samples[::5]],
        "worker_engine_stats": manifest["engine_stats"]["worker_engine_stats"],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"soak-{args.rows}rows-{time.strftime('%Y-%m-%d')}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2))
    plot(fleet.samples, stem.with_suffix(".png"))

    print(f"\n{args.rows} rows in {args.shards} shards, {args.workers} workers, model {args.model}, "
          f"max_tokens {args.max_tokens}: {result['status']}")
    print(f"wall {wall:.0f} s, {result['rows_per_s']} rows/s; rows in {len(ids)}, out {len(out_ids)}, "
          f"unique {len(set(out_ids))}, ids match: {result['ids_match']}, row errors {result['row_errors']}")
    print(f"RSS MiB per worker: before the job {result['rss_before_job_mib']}, first quarter {first_q}, "
          f"last quarter {last_q}, peak {result['peak_rss_mib']}")
    print(f"queue depth: max {result['max_queue_depth']} waiting; (t s, waiting, unacked, shards done):")
    print("  " + " ".join(str(x) for x in result["queue_depth"]))
    print(f"written: {stem}.json, {stem}.png")


if __name__ == "__main__":
    main()
