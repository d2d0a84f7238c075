"""Host overhead of two trees side by side: bench/host_overhead.py run alternately from each tree's
folder (A, B, A, B, ...), each run in its own process, then per-case ratios and their medians.

    git archive 5bb9efc engine | tar -x -C .base && cp bench/host_overhead.py bench/sysinfo.py .base/bench/
    PYTHONPATH= .venv/bin/python bench/host_overhead_ab.py --before .base --after . --pairs 2 --out bench/published

Extra arguments after ``--`` go to every host_overhead.py run. With ``--interleave`` each tree
runs in one long-lived process (``host_overhead.py --serve``) and the two alternate case by case,
the first side swapping every pair, so a machine that changes speed over minutes moves both:

    PYTHONPATH= .venv/bin/python bench/host_overhead_ab.py --before .base --after . --interleave \
        --pairs 9 --cases 1024/mixed/greedy/on 1024/decode/greedy/on -- --steps 60
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


class Server:
    """A tree's host_overhead.py --serve: one process that runs the cases it is sent."""

    def __init__(self, tree: Path, extra: list[str]) -> None:
        tree = tree.resolve()
        self.proc = subprocess.Popen(
            [sys.executable, str(tree / "bench" / "host_overhead.py"), "--serve", *extra], cwd=tree, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=os.environ | {"PYTHONPATH": str(tree)})
        self._expect("ready")

    def _expect(self, word: str) -> str:
        for line in self.proc.stdout:
            if line.startswith(word):
                return line[len(word):].strip()
        raise RuntimeError(f"host_overhead.py --serve ended before {word!r}")

    def run(self, case: dict) -> dict:
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._expect("result"))

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def interleaved(trees: dict[str, Path], pairs: int, extra: list[str], cases: list[dict]) -> dict[str, list[list[dict]]]:
    """Both trees' servers up at once; every case runs before, after (after, before in odd pairs)."""
    servers = {side: Server(tree, extra) for side, tree in trees.items()}
    runs: dict[str, list[list[dict]]] = {side: [[] for _ in range(pairs)] for side in trees}
    try:
        for pair in range(pairs):
            for case in cases:
                for side in (("before", "after") if pair % 2 == 0 else ("after", "before")):
                    runs[side][pair].append(servers[side].run(case))
            print(f"pair {pair} done", flush=True)
    finally:
        for server in servers.values():
            server.close()
    return runs


def key(r: dict) -> str:
    """The case's name; the engine mode too where the run set one (async on and off may both run)."""
    mode = r.get("async")
    return f"{r['size']}/{r['workload']}/{r['sampling']}" + (f"/async-{mode}" if mode else "")


def summarise(runs: dict[str, list[list[dict]]]) -> dict[str, dict]:
    """Per case: both sides' figures per pair, their medians and the median of the pair ratios."""
    cases = {}
    for i, r in enumerate(runs["after"][0]):
        k = key(r)
        walls = {side: [p[i]["wall_us_per_step"] for p in runs[side]] for side in runs}
        parts = {side: {part: statistics.median(p[i]["parts_us_per_step"][part] for p in runs[side])
                        for part in r["parts_us_per_step"]} for side in runs}
        ratios = [b / a for b, a in zip(walls["before"], walls["after"], strict=True)]
        # the figure: host work without the stub model and the sampler's arithmetic
        host = {side: [p[i].get("host_us_excluding_model_and_sampler") for p in runs[side]] for side in runs}
        host_ratios = [b / a for b, a in zip(host["before"], host["after"], strict=True) if a and b]
        cases[k] = {"wall_us_before": walls["before"], "wall_us_after": walls["after"],
                    "before_over_after_per_pair": [round(x, 3) for x in ratios],
                    "median_ratio": round(statistics.median(ratios), 3),
                    "host_us_before": host["before"], "host_us_after": host["after"],
                    "host_median_ratio": round(statistics.median(host_ratios), 3) if host_ratios else None,
                    "median_parts_us_before": parts["before"], "median_parts_us_after": parts["after"]}
        line = (f"{k:28s} wall before {statistics.median(walls['before']):7.0f} after "
                f"{statistics.median(walls['after']):7.0f} us ({cases[k]['median_ratio']})")
        if host_ratios:
            line += (f"  host before {statistics.median(host['before']):7.0f} after "
                     f"{statistics.median(host['after']):7.0f} us ({cases[k]['host_median_ratio']})")
        print(line)
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, required=True)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--note", default="", help="what the two trees are (git revisions), kept in the JSON")
    ap.add_argument("--interleave", action="store_true",
                    help="both trees in one long-lived process each, alternating case by case (less drift)")
    ap.add_argument("--cases", nargs="+", default=["1024/mixed/greedy/on"],
                    help="with --interleave: SIZE/WORKLOAD/SAMPLING/ASYNC (on, off or default)")
    args, extra = ap.parse_known_args()
    extra = [a for a in extra if a != "--"]
    info = sysinfo.cpu_info()
    print(sysinfo.describe(info))
    runs: dict[str, list[list[dict]]] = {"before": [], "after": []}
    if args.interleave:
        cases = [{"size": int(size), "workload": workload, "sampling": sampling,
                  "async": None if mode == "default" else mode}
                 for size, workload, sampling, mode in (c.split("/") for c in args.cases)]
        runs = interleaved({"before": args.before, "after": args.after}, args.pairs, extra, cases)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            for pair in range(args.pairs):
                for side in ("before", "after"):
                    tree = args.before if side == "before" else args.after
                    print(f"pair {pair} {side}: {tree}", flush=True)
                    runs[side].append(run(tree, Path(tmp) / f"{side}-{pair}", extra))
    cases = summarise(runs)
    result = {"bench": "host_overhead_ab", "command": " ".join(sys.argv), "system": info, "trees": args.note,
              "before": str(args.before), "after": str(args.after), "cases": cases, "runs": runs}
    if args.out:
        sysinfo.write_result(args.out, "host-overhead-ab", result)


if __name__ == "__main__":
    main()
