"""A/B of one engine feature in one process: the same engine, the feature switched on and off
between alternating runs of one workload (on-off, off-on, ...), so host drift hits both sides.

    PYTHONPATH=$PWD .venv/bin/python bench/ab_engine.py huge-pages summ-256 float32 --pairs 2 --out bench/published

Features: ``few-rows`` (few_rows.c for products of a few rows), ``huge-pages`` (transparent
huge pages for the KV pool; the pool is re-allocated each run), ``prefill-kernel`` (the C
prefill attention kernel against SDPA per chunk).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_engine  # noqa: E402
import sysinfo  # noqa: E402

from engine import LLM  # noqa: E402
from engine.models.linear import Linear  # noqa: E402

FEATURES = ("few-rows", "huge-pages", "prefill-kernel")


def switch(llm: LLM, feature: str, on: bool, saved: dict) -> None:
    runner = llm.engine.runner
    if feature == "few-rows":
        for m in runner.model.modules():
            if isinstance(m, Linear):
                saved.setdefault(id(m), m.few_rows_max)
                m.few_rows_max = saved[id(m)] if on else 0
    elif feature == "huge-pages":
        os.environ["TOKENMILL_KV_HUGE_PAGES"] = "1" if on else "0"
        runner.bind_kv_pool(None)
        gc.collect()
        runner.bind_kv_pool(runner.allocate_kv_pool(runner.num_kv_blocks))
    elif feature == "prefill-kernel":
        for layer in runner.model.attention_layers():
            layer.backend.prefill_kernel = on


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("feature", choices=FEATURES)
    ap.add_argument("workload", choices=bench_engine.WORKLOADS)
    ap.add_argument("dtype", choices=("float32", "bfloat16"))
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--out", help="directory for the JSON")
    args = ap.parse_args()
    info = sysinfo.cpu_info()
    print(sysinfo.describe(info))
    llm = LLM(bench_engine.DEFAULT_MODEL, dtype=args.dtype, max_num_batched_tokens=2048, kv_cache_memory_gb=4.0)
    wl = bench_engine.build_workloads(llm.tokenizer, [args.workload])[args.workload]
    saved: dict = {}
    bench_engine.run_tokenmill(llm, wl, True)  # warm-up
    runs = []
    for rep in range(args.pairs):
        for on in (True, False) if rep % 2 == 0 else (False, True):
            switch(llm, args.feature, on, saved)
            r = bench_engine.run_tokenmill(llm, wl, True)
            runs.append({"pair": rep, "on": on, "output_tok_s": r["output_tok_s"], "wall_s": r["wall_s"],
                         "load": r["load"]})
            print(f"  {args.feature} {'on ' if on else 'off'}: {r['output_tok_s']:.1f} out tok/s", flush=True)
    ratios = [next(r["output_tok_s"] for r in runs if r["pair"] == p and r["on"])
              / next(r["output_tok_s"] for r in runs if r["pair"] == p and not r["on"]) for p in range(args.pairs)]
    result = {"info": info, "feature": args.feature, "workload": args.workload, "dtype": args.dtype,
              "runs": runs, "pair_ratios": ratios, "median_ratio": statistics.median(ratios)}
    print(f"{args.workload} {args.dtype}: {args.feature} on/off median of pair ratios {result['median_ratio']:.3f} "
          f"({', '.join(f'{x:.3f}' for x in ratios)})")
    if args.out:
        sysinfo.write_result(args.out, f"ab-{args.feature}-{args.workload}-{args.dtype}", result)


if __name__ == "__main__":
    main()
