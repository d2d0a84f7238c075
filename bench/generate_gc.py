"""Full collections of Python's cyclic collector inside ``LLM.generate`` (issue 26), with and
without ``engine.host.objects_frozen_during_call``.

The model is the issue's: one layer, 64 wide, a 512-token vocabulary, so the engine's host work
is most of a step. Each side runs in its own process (the collector's counts are per process),
the sides alternating; a process makes ``--rounds`` calls of ``--requests`` prompts of 20-200
tokens, and records every collection of the oldest generation, inside a call or between calls.

    PYTHONPATH=$PWD .venv/bin/python bench/generate_gc.py --out bench/published
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sysinfo  # noqa: E402


def one_side(frozen: bool, requests: int, rounds: int, max_tokens: int) -> dict:
    """One process's calls; ``frozen`` False swaps the context manager for a null one."""
    import host_overhead

    import engine.llm
    from engine import LLM, SamplingParams

    if not frozen:
        engine.llm.objects_frozen_during_call = contextlib.nullcontext
    model_dir = host_overhead.build_model_dir(Path(tempfile.mkdtemp()))
    llm = LLM(str(model_dir), max_num_seqs=requests, max_num_batched_tokens=max(2048, requests),
              num_kv_blocks=requests * 40, num_threads=1)
    rng = random.Random(0)
    inside, full = [False], []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            on_gc.t = time.perf_counter()
        elif info["generation"] == 2:
            full.append((inside[0], (time.perf_counter() - on_gc.t) * 1e3))

    gc.callbacks.append(on_gc)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    calls, kept = [], []
    start = time.perf_counter()
    for _ in range(rounds):
        prompts = [[rng.randrange(3, 500) for _ in range(rng.randrange(20, 200))] for _ in range(requests)]
        inside[0] = True
        t = time.perf_counter()
        outs = llm.generate(prompts, params)
        calls.append((time.perf_counter() - t) * 1e3)
        inside[0] = False
        kept.append([o.token_ids for o in outs])  # a user keeps the results
    total = time.perf_counter() - start
    gc.callbacks.remove(on_gc)
    ms_in = [ms for i, ms in full if i]
    ms_out = [ms for i, ms in full if not i]
    return {"frozen": frozen, "total_s": round(total, 3), "call_ms": [round(x, 1) for x in calls],
            "full_inside": len(ms_in), "full_inside_ms": [round(x, 1) for x in ms_in],
            "full_between": len(ms_out), "full_between_ms": [round(x, 1) for x in ms_out],
            "steps": llm.stats()["steps"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--side", choices=["on", "off"], help=argparse.SUPPRESS)  # a child process
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.side:
        print(json.dumps(one_side(args.side == "on", args.sizes[0], args.rounds, args.max_tokens)))
        return
    info = sysinfo.cpu_info()
    print(sysinfo.describe(info), flush=True)
    cases = []
    for size in args.sizes:
        runs = []
        for pair in range(args.pairs):
            for side in (("off", "on") if pair % 2 == 0 else ("on", "off")):
                cmd = [sys.executable, __file__, "--side", side, "--sizes", str(size), "--rounds", str(args.rounds),
                       "--max-tokens", str(args.max_tokens)]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                run = json.loads(out.strip().splitlines()[-1])
                runs.append(run)
                print(f"{size} {side}: {run['total_s']} s, full collections inside calls {run['full_inside_ms']} ms, "
                      f"between {run['full_between_ms']} ms", flush=True)
        on = [r for r in runs if r["frozen"]]
        off = [r for r in runs if not r["frozen"]]
        cases.append({
            "requests": size, "runs": runs,
            "full_inside_ms_sum": {"off": round(sum(sum(r["full_inside_ms"]) for r in off), 1),
                                   "on": round(sum(sum(r["full_inside_ms"]) for r in on), 1)},
            "full_between_ms_sum": {"off": round(sum(sum(r["full_between_ms"]) for r in off), 1),
                                    "on": round(sum(sum(r["full_between_ms"]) for r in on), 1)},
            "total_s_median": {"off": statistics.median(r["total_s"] for r in off),
                               "on": statistics.median(r["total_s"] for r in on)},
            "slowest_call_ms_median": {"off": statistics.median(max(r["call_ms"]) for r in off),
                                       "on": statistics.median(max(r["call_ms"]) for r in on)},
        })
    result = {"bench": "generate_gc", "command": " ".join(["bench/generate_gc.py", *sys.argv[1:]]), "system": info,
              "rounds": args.rounds, "max_tokens": args.max_tokens, "cases": cases}
    print(json.dumps([{k: v for k, v in c.items() if k != "runs"} for c in cases], indent=1))
    if args.out:
        print(sysinfo.write_result(args.out, "generate-gc", result))


if __name__ == "__main__":
    main()
