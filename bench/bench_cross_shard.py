"""Cross-shard feeding vs draining the engine between shards, side by side in one run.

Many small shards are the worst case for a worker that drains its engine at every shard
boundary: each shard's last requests decode in a nearly empty batch. Both modes run the
same job through ``run_embedded`` on a fresh, warmed engine each.

    .venv/bin/python bench/bench_cross_shard.py --shards 24 --rows 8 --max-tokens 24
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import EngineConfig, LLMEngine  # noqa: E402
from engine.model_registry import DEFAULT_MODEL  # noqa: E402
from pipeline.engine_cache import warm_up  # noqa: E402
from pipeline.job_runner import run_embedded  # noqa: E402
from pipeline.plan import JobPlan, PromptPlan  # noqa: E402

WORDS = (
    "the council approved a new budget for river restoration after months of debate among farmers "
    "engineers and residents who argued about water rights flood risk fish habitat and the cost of "
    "removing two old dams while the mayor promised public hearings and a review by independent experts"
).split()


def write_shards(root: Path, shards: int, rows: int, seed: int) -> None:
    rng = random.Random(seed)
    for s in range(shards):
        with open(root / f"shard-{s:03d}.jsonl", "w") as f:
            for r in range(rows):
                text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 160)))
                f.write(json.dumps({"id": f"s{s}-r{r}", "text": text}) + "\n")


def run_mode(cross: bool, args, inp: Path, out: Path) -> dict:
    settings = {"model": args.model, "max_num_seqs": args.max_num_seqs,
                "max_num_batched_tokens": args.max_batched_tokens, "num_threads": args.threads}
    engine = LLMEngine(EngineConfig(**settings))
    warm_up(engine)
    plan = JobPlan(
        job_id=f"bench-{'cross' if cross else 'drain'}", name="bench", kind="summarize",
        input_url=str(inp), output_url=str(out / ("cross" if cross else "drain")), id_field="id",
        prompt=PromptPlan(system="Summarize the document in one sentence.", user_template="Document:\n{text}"),
        sampling={"max_tokens": args.max_tokens, "temperature": 0.0}, engine_settings=settings,
    )
    t = time.perf_counter()
    manifest = run_embedded(plan, progress=False, cross_shard=cross, engine=engine)
    wall = time.perf_counter() - t
    stats = manifest["engine_stats"]
    del engine
    gc.collect()
    return {
        "mode": "cross-shard" if cross else "drain per shard",
        "wall_s": wall,
        "rows": manifest["totals"]["rows"],
        "output_tokens": manifest["totals"]["output_tokens"],
        "output_tok_s": manifest["totals"]["output_tokens"] / wall,
        "rows_s": manifest["totals"]["rows"] / wall,
        "mean_running_seqs": stats["mean_running_seqs"],
        "peak_running_seqs": stats["peak_running_seqs"],
        "steps": stats["steps"],
    }


def shard_job_arguments(description: str | None) -> argparse.ArgumentParser:
    """The many-small-shards job both cross-shard benches run (this one and bench_fleet.py)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--shards", type=int, default=24)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-batched-tokens", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    return p


def report_ratios(results: list[dict], args: argparse.Namespace) -> None:
    """Each mode against the first (the draining one), and the JSON file if asked for."""
    base = results[0]
    for r in results[1:]:
        print(f"{r['mode']} / {base['mode']}: {r['output_tok_s'] / base['output_tok_s']:.2f}x output tok/s, "
              f"{r['mean_running_seqs'] / base['mean_running_seqs']:.2f}x mean running sequences")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results},
                                        indent=2))


def main() -> None:
    p = shard_job_arguments(__doc__)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        inp, out = Path(tmp) / "in", Path(tmp) / "out"
        inp.mkdir()
        write_shards(inp, args.shards, args.rows, args.seed)
        results = [run_mode(False, args, inp, out), run_mode(True, args, inp, out)]

    print(f"\n{args.shards} shards x {args.rows} rows, model {args.model}, max_tokens {args.max_tokens}, "
          f"max_num_seqs {args.max_num_seqs}")
    header = f"{'mode':<18}{'wall s':>9}{'out tok/s':>11}{'rows/s':>9}{'mean running':>14}{'peak':>6}{'steps':>7}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['mode']:<18}{r['wall_s']:>9.1f}{r['output_tok_s']:>11.1f}{r['rows_s']:>9.2f}"
              f"{r['mean_running_seqs']:>14.2f}{r['peak_running_seqs']:>6}{r['steps']:>7}")
    report_ratios(results, args)


if __name__ == "__main__":
    main()
