"""How much of a run is the linear products, per variant: the issue-44 uniform batch and the
few-sequence decode case, with wall-clock timers around every ``Linear`` / ``Int8Linear`` /
``Int4Linear`` forward (LM head apart). What is left (attention, norms, rotary, sampling, the
scheduler) is the same work for every variant, so it bounds what a faster product can give.

    PYTHONPATH=$PWD .venv/bin/python bench/probe_linear_share.py --out bench/published
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bench_quantized import checkpoints, simd_flags, timed  # noqa: E402
from sysinfo import cpu_info, write_result  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402
from engine.models.linear import Linear  # noqa: E402
from engine.quant.linear import Int4Linear, Int8Linear  # noqa: E402

SECONDS: collections.Counter = collections.Counter()


def instrument(cls) -> None:
    forward = cls.forward

    def timed_forward(self, x):
        t = time.perf_counter()
        y = forward(self, x)
        SECONDS["lm_head" if self.out_features > 40000 else "layers"] += time.perf_counter() - t
        return y

    cls.forward = timed_forward


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="float32,gguf-q4_1-float32,bfloat16,int8-w8a8,int4-w4a16,gguf-q4_1")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="bench/published")
    args = ap.parse_args()
    for cls in (Linear, Int8Linear, Int4Linear):
        instrument(cls)
    rng = random.Random(0)
    cases = {"uniform 64 x (338 + 96)": ([[rng.randrange(3, 49152) for _ in range(338)] for _ in range(64)], 96),
             "decode 2 x 64": ([[rng.randrange(3, 49152) for _ in range(64)] for _ in range(2)], 64)}
    every = checkpoints("int4", 64, False, [])
    llms = {}
    for name in args.variants.split(","):
        folder, dtype, quant = every[name]
        llms[name] = LLM(str(folder), dtype=dtype, quantization=quant, num_kv_blocks=64 * 28 + 64)
        llms[name].generate(cases["decode 2 x 64"][0], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    result = {"command": " ".join(sys.argv), "cpu": cpu_info() | simd_flags(), "rounds": []}
    for r in range(args.rounds):
        row = {}
        for name in list(llms) if r % 2 == 0 else list(llms)[::-1]:
            for case, (prompts, out_len) in cases.items():
                SECONDS.clear()
                wall, _ = timed(llms[name], prompts, SamplingParams(max_tokens=out_len, temperature=0, ignore_eos=True))
                row.setdefault(case, {})[name] = {"wall_s": round(wall, 3), "layers_s": round(SECONDS["layers"], 3),
                                                  "lm_head_s": round(SECONDS["lm_head"], 3),
                                                  "rest_s": round(wall - SECONDS["layers"] - SECONDS["lm_head"], 3)}
                print(r, case, name, row[case][name], flush=True)
        result["rounds"].append(row)
    write_result(args.out, "linear-share", result)


if __name__ == "__main__":
    main()
