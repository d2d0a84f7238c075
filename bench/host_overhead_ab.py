"""Host overhead of two trees side by side: bench/host_overhead.py run alternately from each tree's
folder (A, B, A, B, ...), each run in its own process, then per-case ratios and their medians.

    git archive 5bb9efc engine | tar -x -C .base && cp bench/host_overhead.py bench/sysinfo.py .base/bench/
    PYTHONPATH= .venv/bin/python bench/host_overhead_ab.py --before .base --after . --pairs 2 --out bench/published

Extra arguments after ``--`` go to every host_overhead.py run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sysinfo  # noqa: E402


def run(tree: Path, out: Path, extra: list[str]) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("*.json"))
    tree = tree.resolve()
    cmd = [sys.executable, str(tree / "bench" / "host_overhead.py"), "--out", str(out), *extra]
    subprocess.run(cmd, check=True, cwd=tree, env=os.environ | {"PYTHONPATH": str(tree.resolve())})
    (new,) = set(out.glob("*.json")) - before
    return json.loads(new.read_text())["results"]


def key(r: dict) -> str:
    return f"{r['size']}/{r['workload']}/{r['sampling']}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, required=True)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--out", default=None)
    args, extra = ap.parse_known_args()
    extra = [a for a in extra if a != "--"]
    info = sysinfo.cpu_info()
    print(sysinfo.describe(info))
    runs: dict[str, list[list[dict]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            for side in ("before", "after"):
                tree = args.before if side == "before" else args.after
                print(f"pair {pair} {side}: {tree}", flush=True)
                runs[side].append(run(tree, Path(tmp) / f"{side}-{pair}", extra))
    cases = {}
    for i, r in enumerate(runs["after"][0]):
        k = key(r)
        walls = {side: [p[i]["wall_us_per_step"] for p in runs[side]] for side in runs}
        parts = {side: {part: statistics.median(p[i]["parts_us_per_step"][part] for p in runs[side])
                        for part in r["parts_us_per_step"]} for side in runs}
        ratios = [b / a for b, a in zip(walls["before"], walls["after"], strict=True)]
        cases[k] = {"wall_us_before": walls["before"], "wall_us_after": walls["after"],
                    "before_over_after_per_pair": [round(x, 3) for x in ratios],
                    "median_ratio": round(statistics.median(ratios), 3),
                    "median_parts_us_before": parts["before"], "median_parts_us_after": parts["after"]}
        print(f"{k:22s} before {statistics.median(walls['before']):8.0f} us  after "
              f"{statistics.median(walls['after']):8.0f} us  ratio {cases[k]['median_ratio']}")
    result = {"bench": "host_overhead_ab", "command": " ".join(sys.argv), "system": info,
              "before": str(args.before), "after": str(args.after), "cases": cases, "runs": runs}
    if args.out:
        sysinfo.write_result(args.out, "host-overhead-ab", result)


if __name__ == "__main__":
    main()
