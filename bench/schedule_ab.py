"""Scheduling with two trees' block managers, alternated step by step in one process.

The before tree's ``engine/block_manager.py`` is loaded beside the current one; each drives its
own scheduler (the current one) over the same workload: ``--size`` sequences with prompts of
20-200 tokens (so their block boundaries fall on different steps), prefix caching on, greedy
tokens fed back through ``Scheduler.update``; in ``mixed`` new 200-token prompts keep arriving
as sequences finish. Each step times ``schedule()`` on both sides, swapping which goes first
every step; the figure is the median ratio of the steps' pairs, and the mean over steps. The
cyclic collector runs between steps, not inside either side's timing.

    PYTHONPATH=$PWD .venv/bin/python bench/schedule_ab.py --before /tmp/base --out bench/published
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sysinfo  # noqa: E402

from engine import block_manager  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.scheduler import Scheduler  # noqa: E402
from engine.sequence import Sequence  # noqa: E402
from engine.stopping import StopConditions  # noqa: E402


def load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Side:
    """One scheduler over its own block manager and its own copies of the workload's sequences."""

    def __init__(self, manager_class, size: int) -> None:
        bm = manager_class(num_blocks=size * 40, block_size=16, enable_prefix_caching=True)
        self.sched = Scheduler(bm, max_num_seqs=size, max_num_batched_tokens=max(2048, size),
                               stop=StopConditions(frozenset({2})))
        self.times: list[float] = []
        self.count = 0

    def add(self, prompt: list[int], max_tokens: int) -> None:
        self.count += 1
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        self.sched.add(Sequence(f"r{self.count}", prompt, params))

    def step(self) -> None:
        t = time.perf_counter()
        batch = self.sched.schedule()
        self.times.append(time.perf_counter() - t)
        self.sched.update({it.seq: (len(it.seq.token_ids) * 7) % 500 + 3 for it in batch.items if it.samples})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="a tree holding engine/block_manager.py (git archive REV engine)")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=320)
    ap.add_argument("--workloads", nargs="+", default=["decode", "mixed"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    info = sysinfo.cpu_info()
    print(sysinfo.describe(info), flush=True)
    before = load_module("before_block_manager", Path(args.before) / "engine" / "block_manager.py")
    results = {}
    for workload in args.workloads:
        rng = random.Random(0)
        sides = {"before": Side(before.BlockManager, args.size), "after": Side(block_manager.BlockManager, args.size)}

        def add(prompt_len: int, max_tokens: int, rng=rng, sides=sides) -> None:
            prompt = [rng.randrange(3, 500) for _ in range(prompt_len)]
            for side in sides.values():
                side.add(prompt, max_tokens)

        for _ in range(args.size):
            if workload == "decode":
                add(rng.randrange(20, 200), 10**6)
            else:
                add(200, rng.randrange(100, 300))
        while len(sides["after"].sched.running) < 0.9 * args.size:  # admitted (and past the prompts)
            for side in sides.values():
                side.step()
        for side in sides.values():
            side.times.clear()
        gc.disable()  # a collection would land on whichever side crossed the threshold: run them between steps
        for step in range(args.steps):
            if step % 8 == 0:
                gc.collect(0)
            if workload == "mixed":
                while len(sides["after"].sched.waiting) < args.size // 4:
                    add(200, rng.randrange(100, 300))
            order = list(sides.values())
            for side in order[::-1] if step % 2 else order:
                side.step()
        gc.enable()
        b, a = sides["before"].times, sides["after"].times
        results[workload] = {
            "before_us_mean": round(statistics.mean(b) * 1e6, 1), "after_us_mean": round(statistics.mean(a) * 1e6, 1),
            "before_us_median": round(statistics.median(b) * 1e6, 1),
            "after_us_median": round(statistics.median(a) * 1e6, 1),
            "median_before_over_after": round(statistics.median(x / y for x, y in zip(b, a, strict=True)), 3),
            "mean_running": round(statistics.mean([len(sides["after"].sched.running)]), 1),
        }
        print(workload, results[workload], flush=True)
    result = {"bench": "schedule_ab", "command": " ".join(sys.argv), "system": info, "before": args.before,
              "size": args.size, "steps": args.steps, "results": results}
    if args.out:
        sysinfo.write_result(args.out, "schedule-ab", result)


if __name__ == "__main__":
    main()
