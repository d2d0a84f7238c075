"""W8A8 products at decode and prefill row counts, SmolLM2-135M's shapes (gate/up packed 3072 x 576,
down 576 x 1536, q/k/v packed 960 x 576), bfloat16 rows, against the packed bfloat16 product.

Variants, alternating round by round: ``bf16_packed`` (engine/models/linear.py's Linear, packed),
``int8_old`` (Int8Linear before the C kernel: quantize_rows, torch._int_mm on the [in, out]
weight, eager scaling; on a CPU without VNNI, the float route through _weight_int8pack_mm),
``int8_new`` (Int8Linear now), ``int8_old_no_vnni`` (the old route of CPUs without VNNI, forced), ``kernel_<isa>`` (int8_rows.c alone, each build this CPU runs)
``int_mm_fused`` / ``int_mm_fused_t`` (C quantize, torch._int_mm on the [in, out] weight or
the [out, in] one transposed, C scaling); with ``--group-int8``, ``q8_0`` / ``q8_0_torch``
(GroupInt8Linear on the same weight in Q8_0's layout, with its few-row kernel and without). Each figure: microseconds per call, the mean of
``--reps`` calls, best (``best_us``, what the shared machine disturbed least) and median over rounds.

    PYTHONPATH=$PWD .venv/bin/python bench/probe_int8.py --out bench/published
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.cpu_info import cpu_flags  # noqa: E402
from engine.models.linear import Linear  # noqa: E402
from engine.quant import int8_kernel  # noqa: E402
from engine.quant.checkpoint import QuantWeight  # noqa: E402
from engine.quant.group_int8 import GroupInt8Linear  # noqa: E402
from engine.quant.linear import Int8Linear, exact_int8_gemm, quantize_rows  # noqa: E402

SHAPES = {"gate_up": (3072, 576), "down": (576, 1536), "qkv": (960, 576)}  # (out, in)
MARCH = {"avx2": "haswell", "avx512-bw": "skylake-avx512", "avx-vnni": "alderlake"}
NEEDS = {"avx2": {"avx2", "fma"}, "avx512-bw": {"avx512bw", "avx512vl"}, "avx-vnni": {"avx_vnni"}}


def old_int8(layer: Int8Linear, int_gemm: bool | None = None):
    """Int8Linear.forward as it was before the kernel (weight [in, out] contiguous for _int_mm;
    ``int_gemm`` False: the route of CPUs without VNNI)."""
    w_t, w_scale = layer.weight.t().contiguous(), layer.weight_scale
    int_gemm = exact_int8_gemm() if int_gemm is None else int_gemm

    def forward(x: torch.Tensor) -> torch.Tensor:
        xq, x_scale = quantize_rows(x)
        if int_gemm:
            out = torch._int_mm(xq, w_t).float().mul_(x_scale).mul_(w_scale)
        else:
            out = torch.ops.aten._weight_int8pack_mm(xq.float() * x_scale, layer.weight, w_scale)
        return out.to(x.dtype)

    return forward


def variants(out: int, cols: int) -> dict:
    torch.manual_seed(0)
    w = torch.randn(out, cols) * 0.05
    scale = w.abs().amax(1, keepdim=True) / 127
    qw = QuantWeight(torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale, None, cols)
    bf16 = Linear(cols, out, bias=False)
    bf16.weight.data = w.to(torch.bfloat16)
    bf16.pack()
    new = Int8Linear(qw, None)
    fns = {"bf16_packed": bf16, "int8_old": old_int8(new), "int8_new": new, "int8_old_no_vnni": old_int8(new, False)}
    comp, ws = int8_kernel.compensation(new.weight), new.weight_scale
    builds = {int8_kernel.isa(int8_kernel.library()): int8_kernel.library()}
    for isa, march in MARCH.items():
        if NEEDS[isa] <= cpu_flags() and isa not in builds:
            builds[isa] = int8_kernel.build(march)
    for isa, lib in builds.items():
        fns[f"kernel_{isa}"] = lambda x, lib=lib: int8_kernel.linear(lib, x, new.weight, comp, ws, None)
    if "--group-int8" in sys.argv:  # GGUF Q8_0's layout: the few-row kernel (up to 8 rows) and the torch route
        g_scale = (w.unflatten(1, (-1, 32)).abs().amax(-1) / 127).half().float()
        g_values = torch.round(w / g_scale.repeat_interleave(32, 1)).clamp(-127, 127).to(torch.int8)
        q8 = GroupInt8Linear(QuantWeight(g_values, g_scale, None, 32), None)
        q8_torch = GroupInt8Linear(QuantWeight(g_values, g_scale, None, 32), None)
        q8_torch.kernel = None
        fns |= {"q8_0": q8, "q8_0_torch": q8_torch}
    if exact_int8_gemm():
        lib, w_t = int8_kernel.library(), new.weight.t().contiguous()
        for name, b in (("int_mm_fused", w_t), ("int_mm_fused_t", new.weight.t())):
            def fused(x, b=b):
                xq, xs = int8_kernel.quantize(lib, x)
                return int8_kernel.scale(lib, torch._int_mm(xq, b), xs, ws, None, x.dtype)
            fns[name] = fused
    return fns


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,2,4,8,16,32,64,256")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch (and kernel) threads; 0: torch's default")
    ap.add_argument("--group-int8", action="store_true", help="also GroupInt8Linear (GGUF Q8_0) with and without its kernel")
    ap.add_argument("--out", default="bench/published")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows_list = [int(r) for r in args.rows.split(",")]
    per_shape = {name: variants(*shape) for name, shape in SHAPES.items()}
    names = list(next(iter(per_shape.values())))
    times: dict = {n: {r: {s: [] for s in SHAPES} for r in rows_list} for n in names}
    for rnd in range(args.rounds):
        for rows in rows_list:
            for name in names if rnd % 2 == 0 else names[::-1]:
                for shape, fns in per_shape.items():
                    x = torch.randn(rows, SHAPES[shape][1]).bfloat16()
                    fns[name](x)
                    t = time.perf_counter()
                    for _ in range(args.reps):
                        fns[name](x)
                    times[name][rows][shape].append((time.perf_counter() - t) / args.reps * 1e6)
        print("round", rnd + 1, "done", flush=True)
    result = {"command": " ".join(sys.argv), "threads": torch.get_num_threads(),
              "cpu_flags": sorted(f for f in cpu_flags() if any(k in f for k in ("avx", "vnni", "amx", "fma"))),
              "int8_int_mm": exact_int8_gemm(), "kernel_isa": int8_kernel.isa(int8_kernel.library()),
              "shapes": SHAPES, "unit": "us per call", "rounds": args.rounds, "reps": args.reps}
    for stat, fn in (("best", min), ("median", statistics.median)):
        per = result[f"{stat}_us"] = {n: {r: {s: round(fn(v), 1) for s, v in times[n][r].items()} for r in rows_list}
                                      for n in names}
        passes = result[f"{stat}_pass_us"] = {n: {r: round(sum(per[n][r].values()), 1) for r in rows_list} for n in names}
        print(f"{stat + ' us per pass (3 shapes)':<30}" + "".join(f"{r:>9}" for r in rows_list))
        for name in names:
            print(f"{name:<30}" + "".join(f"{passes[name][r]:>9}" for r in rows_list))
    out = Path(args.out) / f"probe-int8-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1))
    print("->", out)


if __name__ == "__main__":
    main()
