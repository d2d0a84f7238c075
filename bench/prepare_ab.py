"""Step building of two trees, alternated in one process on the same scheduled batch.

The whole-step A/B (``host_overhead_ab.py``) cannot resolve a change of a few percent on a
machine whose speed drifts by 1.6x within minutes. Here the before tree's ``step_inputs`` module
is loaded beside the current one, both build the inputs of one 1,024-sequence mixed step (the
host-overhead engine and stub model, prefix caching on), alternating call by call and swapping
which goes first every pair; the figure is the median ratio of the pairs. Steady state: the
block-table rows are already in step, so the rows' copies are not in it (the same in both trees).
Both trees must read the batch the same way: the batch comes from the current scheduler, so a
before tree older than the columnar ``ScheduledBatch`` (fd4b409) pays for building ``items`` on
read. Across such a change use ``step_host_ab.py``, which runs each tree's own scheduler.

    PYTHONPATH=$PWD .venv/bin/python bench/prepare_ab.py --before /tmp/base --out bench/published
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import host_overhead  # noqa: E402
import numpy as np  # noqa: E402
import sysinfo  # noqa: E402
import torch  # noqa: E402
import tree_modules  # noqa: E402

from engine import step_inputs  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402


def mixed_step(size: int):
    """An engine at ``size`` running sequences with prompts queued, and one scheduled step of it."""
    engine, _ = host_overhead.make_engine(host_overhead.build_model_dir(Path(tempfile.mkdtemp()) / "m"), size, 0.0,
                                          "off")
    gen = torch.Generator().manual_seed(0)

    def add(name: str, max_tokens: int) -> None:
        prompt = torch.randint(3, host_overhead.VOCAB, (200,), generator=gen).tolist()
        engine.add_request(name, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))

    for i in range(size):
        add(f"r{i}", int(torch.randint(100, 300, (1,), generator=gen)))
    while len(engine.scheduler.running) < 0.9 * size:
        engine.step()
    for i in range(size // 4):
        add(f"w{i}", 200)
    return engine, engine.scheduler.schedule()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="a tree holding engine/step_inputs.py (git archive REV engine)")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--pairs", type=int, default=300)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    info = sysinfo.cpu_info()
    print(sysinfo.describe(info), flush=True)
    (before,) = tree_modules.load_before(args.before, "step_inputs")
    engine, batch = mixed_step(args.size)
    runner, nd = engine.runner, batch.num_decodes
    decodes = [it.seq for it in batch.items[:nd]]
    previous = np.arange(len(runner.table_rows.owner) + 8, dtype=np.int64)  # every row sampled in flight
    previous_tokens = torch.zeros(len(previous), dtype=torch.int64)

    def sync(module):
        module.build_step_inputs(batch, runner.block_size, runner.device, runner.table_rows)

    def overlapped(module):  # async scheduling: the decodes' inputs are placeholders
        for seq in decodes:
            seq.num_pending_tokens = 1
        try:
            module.build_step_inputs(batch, runner.block_size, runner.device, runner.table_rows, previous,
                                     previous_tokens)
        finally:
            for seq in decodes:
                seq.num_pending_tokens = 0

    results = {}
    with torch.inference_mode():
        for name, build in (("synchronous", sync), ("async", overlapped)):
            times: dict[str, list[float]] = {"before": [], "after": []}
            for pair in range(args.pairs):
                sides = [("before", before), ("after", step_inputs)]
                for side, module in sides[::-1] if pair % 2 else sides:
                    t = time.perf_counter()
                    build(module)
                    times[side].append(time.perf_counter() - t)
            ratios = [b / a for b, a in zip(times["before"], times["after"], strict=True)]
            results[name] = {
                "before_us_median": round(statistics.median(times["before"]) * 1e6, 1),
                "after_us_median": round(statistics.median(times["after"]) * 1e6, 1),
                "median_before_over_after": round(statistics.median(ratios), 3),
            }
            print(name, results[name], flush=True)
    result = {"bench": "prepare_ab", "command": " ".join(sys.argv), "system": info, "before": args.before,
              "size": args.size, "items": len(batch.items), "num_decodes": nd, "pairs": args.pairs,
              "results": results}
    if args.out:
        sysinfo.write_result(args.out, "prepare-ab", result)


if __name__ == "__main__":
    main()
