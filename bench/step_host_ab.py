"""A step's scheduling and input building with two trees, alternated step by step in one process.

The before tree's ``scheduler``, ``block_manager`` and ``step_inputs`` modules are loaded beside
the current ones; each side drives its own scheduler, block manager and block-table rows over
the same workload (``--size`` sequences, prompts of 20-200 tokens so block boundaries fall on
different steps, prefix caching on; ``mixed``: new 200-token prompts keep arriving as sequences
finish). Each step times ``schedule()`` and ``build_step_inputs`` (synchronous engine, CPU
tensors) on both sides, swapping which side goes first every step; tokens go back through
``update`` untimed. The figures are medians over steps and the median ratio of the steps'
pairs. The cyclic collector runs between steps, not inside either side's timing.

    PYTHONPATH=$PWD .venv/bin/python bench/step_host_ab.py --before /tmp/base --out bench/published
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sysinfo  # noqa: E402
import torch  # noqa: E402
import tree_modules  # noqa: E402

from engine import block_manager, scheduler, step_inputs  # noqa: E402
from engine.block_table_rows import BlockTableRows  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.sequence import Sequence  # noqa: E402
from engine.stopping import StopConditions  # noqa: E402

BLOCK_SIZE = 16
CPU = torch.device("cpu")
PARTS = ("schedule", "prepare", "update", "both", "all")


class Side:
    """One tree's scheduler, block manager and block-table rows over its own sequences."""

    def __init__(self, modules, size: int) -> None:
        sched_mod, bm_mod, self.inputs_mod = modules
        bm = bm_mod.BlockManager(num_blocks=size * 40, block_size=BLOCK_SIZE, enable_prefix_caching=True)
        self.sched = sched_mod.Scheduler(bm, max_num_seqs=size, max_num_batched_tokens=max(2048, size),
                                         stop=StopConditions(frozenset({2})))
        self.rows = BlockTableRows(4096 // BLOCK_SIZE, rows=size)
        self.times: dict[str, list[float]] = {part: [] for part in PARTS}
        self.count = 0

    def add(self, prompt: list[int], max_tokens: int) -> None:
        self.count += 1
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        self.sched.add(Sequence(f"r{self.count}", prompt, params))

    def step(self, timed: bool) -> None:
        t0 = time.perf_counter()
        batch = self.sched.schedule()
        t1 = time.perf_counter()
        if batch:
            self.inputs_mod.build_step_inputs(batch, BLOCK_SIZE, CPU, self.rows)
        t2 = time.perf_counter()
        sampled = {it.seq: (len(it.seq.token_ids) * 7) % 500 + 3 for it in batch.items if it.samples}
        t3 = time.perf_counter()
        self.sched.update(sampled)
        t4 = time.perf_counter()
        if timed:
            for part, seconds in zip(PARTS, (t1 - t0, t2 - t1, t4 - t3, t2 - t0, t2 - t0 + t4 - t3), strict=True):
                self.times[part].append(seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="a tree holding engine/ (git archive REV engine)")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=320)
    ap.add_argument("--workloads", nargs="+", default=["decode", "mixed"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    info = sysinfo.cpu_info()
    print(sysinfo.describe(info), flush=True)
    before = tree_modules.load_before(args.before, "scheduler", "block_manager", "step_inputs")
    after = (scheduler, block_manager, step_inputs)
    results = {}
    with torch.inference_mode():
        for workload in args.workloads:
            rng = random.Random(0)
            sides = {"before": Side(before, args.size), "after": Side(after, args.size)}

            def add(prompt_len: int, max_tokens: int, rng=rng, sides=sides) -> None:
                prompt = [rng.randrange(3, 500) for _ in range(prompt_len)]
                for side in sides.values():
                    side.add(prompt, max_tokens)

            for _ in range(args.size):
                add(rng.randrange(20, 200) if workload == "decode" else 200,
                    10**6 if workload == "decode" else rng.randrange(100, 300))
            while len(sides["after"].sched.running) < 0.9 * args.size:
                for side in sides.values():
                    side.step(False)
            gc.disable()
            for step in range(args.steps):
                if step % 8 == 0:
                    gc.collect(0)
                if workload == "mixed":
                    while len(sides["after"].sched.waiting) < args.size // 4:
                        add(200, rng.randrange(100, 300))
                order = list(sides.values())
                for side in order[::-1] if step % 2 else order:
                    side.step(True)
            gc.enable()
            entry = {}
            for part in PARTS:
                b, a = sides["before"].times[part], sides["after"].times[part]
                entry[part] = {"before_us_median": round(statistics.median(b) * 1e6, 1),
                               "after_us_median": round(statistics.median(a) * 1e6, 1),
                               "median_before_over_after": round(statistics.median(
                                   x / y for x, y in zip(b, a, strict=True)), 3)}
            results[workload] = entry
            print(workload, entry, flush=True)
    result = {"bench": "step_host_ab", "command": " ".join(sys.argv), "system": info, "before": args.before,
              "size": args.size, "steps": args.steps, "results": results}
    if args.out:
        sysinfo.write_result(args.out, "step-host-ab", result)


if __name__ == "__main__":
    main()
