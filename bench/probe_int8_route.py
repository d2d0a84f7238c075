"""Which W8A8 route wins at each row count: the C kernel (int8_rows.c), torch._int_mm with the C
quantize and scaling, against the engine's packed bfloat16 product, over SmolLM2-135M's four
product shapes (qkv 960 x 576, o 576 x 576, gate/up 3072 x 576, down 576 x 1536), bfloat16 rows.
It sets ``int8_kernel.VNNI_MAX_ROWS`` (the kernel's last row count before _int_mm) on VNNI CPUs.

    PYTHONPATH=$PWD .venv/bin/python bench/probe_int8_route.py --out bench/published
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_quantized import simd_flags  # noqa: E402
from sysinfo import cpu_info, write_result  # noqa: E402

from engine.models.linear import Linear  # noqa: E402
from engine.quant import int8_kernel  # noqa: E402

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in)


def routes(lib, rows: int) -> dict[str, list]:
    """Per route, one callable per shape."""
    out: dict[str, list] = {"kernel": [], "int_mm": [], "bfloat16": []}
    for n, k in SHAPES:
        w = torch.randint(-127, 128, (n, k), dtype=torch.int8)
        comp, ws, x = int8_kernel.compensation(w), torch.rand(n) * 0.01, torch.randn(rows, k).bfloat16()
        lin = Linear(k, n, bias=False).to(torch.bfloat16)
        lin.pack()

        def int_mm(x=x, w=w, ws=ws):
            xq, s = int8_kernel.quantize(lib, x)
            return int8_kernel.scale(lib, torch._int_mm(xq, w.t()), s, ws, None, x.dtype)

        out["kernel"].append(lambda x=x, w=w, c=comp, ws=ws: int8_kernel.linear(lib, x, w, c, ws, None))
        out["int_mm"].append(int_mm)
        out["bfloat16"].append(lambda x=x, lin=lin: lin(x))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,2,4,8,16,32,64,128,256,512,2048")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default="bench/published")
    args = ap.parse_args()
    lib = int8_kernel.library()
    if lib is None:
        sys.exit("no int8 kernel on this machine (no C compiler, or TOKENMILL_CPU_KERNELS=0)")
    result = {"command": " ".join(sys.argv), "cpu": cpu_info() | simd_flags(), "isa": int8_kernel.isa(lib),
              "shapes": SHAPES, "unit": "microseconds per pass over the four shapes, median", "rows": {}}
    print(result["cpu"], result["isa"], flush=True)
    ops = 2 * sum(n * k for n, k in SHAPES)
    with torch.inference_mode():
        for rows in map(int, args.rows.split(",")):
            fns = routes(lib, rows)
            reps = max(1, 2048 // rows)
            times: dict[str, list[float]] = {name: [] for name in fns}
            for fs in fns.values():
                for f in fs:
                    f()
            for r in range(args.rounds):  # routes alternate, order reversed every round
                for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                    t = time.perf_counter()
                    for _ in range(reps):
                        for f in fns[name]:
                            f()
                    times[name].append((time.perf_counter() - t) / reps * 1e6)
            us = {name: round(statistics.median(v), 1) for name, v in times.items()}
            result["rows"][rows] = {"us": us, "gops": {n: round(rows * ops / v / 1e3, 1) for n, v in us.items()}}
            print(rows, result["rows"][rows], flush=True)
    write_result(args.out, "probe-int8-route", result)


if __name__ == "__main__":
    main()
