"""Time the model's linear products and prefill attention by path and row count on this CPU.

The engine picks a path per product (``engine/models/linear.py``): MKL unpacked, oneDNN packed
in float32 or bfloat16, or the few-row C kernel (``engine/native/few_rows.c``), by row count and
by the CPU; and prefill SDPA
in bfloat16 or float32 (``TorchAttentionBackend._sdpa_dtype``). Those rules were measured on
Intel Xeons. This probe measures them again on whatever CPU it lands on and writes JSON, so a
rule can be checked (or changed) with a committed figure behind it.

A "pass" is the model's 121 products back to back (30 layers x qkv, o, gate_up, down, plus the
LM head), each with its own weight, so weights stream from memory as in a real step.

    PYTHONPATH=$PWD .venv/bin/python bench/probe_products.py --out bench/published
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from bench import sysinfo
from engine import native
from engine.models import linear

# SmolLM2-135M: hidden 576, 9 heads x 64 (3 KV heads), intermediate 1536, vocab 49152, 30 layers.
LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in): qkv, o, gate_up, down
LM_HEAD = (49152, 576)
LAYERS = 30


def weights(dtype: torch.dtype) -> list[torch.Tensor]:
    ws = [torch.randn(o, i, dtype=dtype) * 0.02 for _ in range(LAYERS) for o, i in LAYER_SHAPES]
    return ws + [torch.randn(*LM_HEAD, dtype=dtype) * 0.02]


def pack(ws: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.ops.mkldnn._reorder_linear_weight(w, batch_size=64) for w in ws]


def pass_flops(rows: int, ws: list[torch.Tensor]) -> float:
    return sum(2.0 * rows * w.shape[0] * w.shape[1] for w in ws)


def time_pass(fn, xs: dict, ws: list[torch.Tensor], reps: int) -> float:
    """Median ms of one pass of all products."""
    for w in ws[:8]:
        fn(xs[w.shape[1]], w)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for w in ws:
            fn(xs[w.shape[1]], w)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def mkl(x, w):
    return F.linear(x, w)


def onednn(x, w):
    return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")


def few_rows_path(dtype: torch.dtype):
    """few_rows.c's function as a product ``fn(x, w)``, where this CPU can run it."""
    lib = native.few_rows()  # it defines only the functions this CPU's vector units can run
    fn = getattr(lib, "few_rows_bf16" if dtype == torch.bfloat16 else "few_rows_f32", None)
    return None if fn is None else (lambda x, w: linear.few_rows(x, w, fn))


def probe_products(rows_list: list[int]) -> list[dict]:
    f32, bf16 = weights(torch.float32), weights(torch.bfloat16)
    paths = {
        "float32 MKL": (mkl, f32, torch.float32),
        "float32 oneDNN packed": (onednn, pack(f32), torch.float32),
    }
    try:  # oneDNN packs bfloat16 only with avx512bw/vl/dq or avx_ne_convert
        paths["bfloat16 oneDNN packed"] = (onednn, pack(bf16), torch.bfloat16)
    except RuntimeError as exc:
        print(f"bfloat16 oneDNN packed: not on this CPU ({exc})")
    paths["bfloat16 MKL/aten"] = (mkl, bf16, torch.bfloat16)
    for dtype, ws in ((torch.float32, f32), (torch.bfloat16, bf16)):
        fn = few_rows_path(dtype)
        if fn is not None:
            paths[f"{str(dtype).removeprefix('torch.')} few_rows.c"] = (fn, ws, dtype)
    out = []
    for rows in rows_list:
        reps = 7 if rows <= 64 else 3
        for name, (fn, ws, dtype) in paths.items():
            if (name == "bfloat16 MKL/aten" and rows > 64) or ("few_rows" in name and rows > 8):
                continue  # only a reference at few rows; the kernel takes at most 8
            xs = {k: torch.randn(rows, k, dtype=dtype) for k in (576, 1536)}
            ms = time_pass(fn, xs, ws, reps)
            rec = {"rows": rows, "path": name, "ms_per_pass": round(ms, 3),
                   "gflops": round(pass_flops(rows, ws if "packed" not in name else f32) / ms / 1e6, 1)}
            out.append(rec)
            print(f"rows {rows:5d}  {name:24s} {ms:9.2f} ms/pass  {rec['gflops']:8.1f} GFLOP/s", flush=True)
    return out


def probe_sdpa(lengths: list[int]) -> list[dict]:
    out = []
    for n in lengths:
        for dtype in (torch.float32, torch.bfloat16):
            q = torch.randn(1, 9, n, 64, dtype=dtype)
            k = torch.randn(1, 9, n, 64, dtype=dtype)
            v = torch.randn(1, 9, n, 64, dtype=dtype)
            for _ in range(3):
                F.scaled_dot_product_attention(q, k, v, is_causal=True)
            times = []
            for _ in range(9):
                t = time.perf_counter()
                F.scaled_dot_product_attention(q, k, v, is_causal=True)
                times.append((time.perf_counter() - t) * 1e3)
            ms = statistics.median(times)
            out.append({"tokens": n, "dtype": str(dtype).removeprefix("torch."), "ms": round(ms, 3)})
            print(f"SDPA causal {n:5d} tokens {dtype}: {ms:.3f} ms", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 256, 2048])
    ap.add_argument("--sdpa-tokens", type=int, nargs="+", default=[230, 2000])
    ap.add_argument("--out", help="directory for the JSON")
    args = ap.parse_args()
    info = sysinfo.cpu_info()
    print(sysinfo.describe(info))
    result = {"info": info, "load": sysinfo.load(), "products": probe_products(args.rows),
              "sdpa": probe_sdpa(args.sdpa_tokens), "bandwidth_gbs": round(sysinfo.bandwidth_gbs(), 1)}
    print(f"copy bandwidth {result['bandwidth_gbs']} GB/s")
    if args.out:
        sysinfo.write_result(args.out, "probe-products", result)


if __name__ == "__main__":
    main()
