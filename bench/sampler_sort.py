"""Sorting a step's logits on the CPU: torch's sort and top-k against numpy's, values only.

The sampler's top-k/top-p filter needs each row's largest values in order (not their indices);
this measures which library gives them fastest on this CPU, one thread, alternating the methods.

    PYTHONPATH=$PWD .venv/bin/python bench/sampler_sort.py --out bench/published
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import sysinfo  # noqa: E402
import torch  # noqa: E402

from engine.sampler import _sorted_descending  # noqa: E402


def timed(fn, repeats: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["256x512", "64x49152", "256x49152"])
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    info = sysinfo.cpu_info()
    print(sysinfo.describe(info))
    rows = []
    for shape in args.shapes:
        n, vocab = map(int, shape.split("x"))
        x = torch.randn(n, vocab, generator=torch.Generator().manual_seed(0))
        repeats = max(1, 2_000_000 // (n * vocab))
        assert torch.equal(_sorted_descending(x, None), torch.sort(x, dim=-1, descending=True).values)
        assert torch.equal(_sorted_descending(x, args.k), torch.topk(x, args.k, dim=-1).values)
        a = x.numpy()
        methods = {
            "torch.sort": lambda x=x: torch.sort(x, dim=-1, descending=True),
            "numpy sort": lambda a=a: np.sort(a, axis=-1),
            "sampler, all values": lambda x=x: _sorted_descending(x, None),
            f"torch.topk k={args.k}": lambda x=x: torch.topk(x, args.k, dim=-1),
            f"numpy partition+sort k={args.k}": lambda a=a, v=vocab: np.sort(
                np.partition(a, v - args.k, axis=-1)[:, v - args.k :], axis=-1),
            f"sampler, k={args.k}": lambda x=x: _sorted_descending(x, args.k),
        }
        times: dict[str, list[float]] = {m: [] for m in methods}
        for _ in range(args.rounds):
            for name, fn in methods.items():
                times[name].append(timed(fn, repeats))
        row = {"shape": shape, "us_median": {m: round(statistics.median(t), 1) for m, t in times.items()},
               "us_all": {m: [round(v, 1) for v in t] for m, t in times.items()}}
        rows.append(row)
        print(shape, "  ".join(f"{m}: {v:.0f} us" for m, v in row["us_median"].items()))
    result = {"bench": "sampler_sort", "command": " ".join(sys.argv), "system": info, "load": sysinfo.load(),
              "results": rows}
    if args.out:
        sysinfo.write_result(args.out, "sampler-sort", result)


if __name__ == "__main__":
    main()
