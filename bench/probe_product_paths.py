"""The product paths chosen on 2026-12-08, each beside what it replaced, one process, alternating:

- ``epilogue``: int8_rows.c's scaling of int32 sums into bfloat16 (and float32) outputs, built from
  this tree and from ``--before`` (the scalar bfloat16 loop), 2,048 x 1,536 sums;
- ``float32``: a float32 weight written for the call (Int4Linear beyond its kernel's rows), MKL's
  ``F.linear`` against oneDNN on the weight reordered for the call (``float32_product``);
- ``bfloat16``: a bfloat16 weight written for the call, ``F.linear`` (kept) against ``weight @ x.T``
  made contiguous (``weight_major_product`` in the JSON: tried for Int4Linear on 2026-12-08, not kept).

    PYTHONPATH=$PWD .venv/bin/python bench/probe_product_paths.py --out bench/published
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_quantized import simd_flags  # noqa: E402
from sysinfo import cpu_info, write_result  # noqa: E402

from engine import native  # noqa: E402
from engine.models.linear import PACK_ROWS_HINT  # noqa: E402
from engine.quant import int8_kernel  # noqa: E402

SHAPES = [(3072, 576), (576, 1536)]  # (out, in): gate/up and down


def median_us(fns: dict, rounds: int = 9) -> dict[str, float]:
    """Median microseconds of each callable, the callables alternating, order reversed every round."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for f in fns.values():
        f()
    for r in range(rounds):
        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            t = time.perf_counter()
            fns[name]()
            times[name].append((time.perf_counter() - t) * 1e6)
    return {name: round(statistics.median(v), 1) for name, v in times.items()}


def old_int8_library(rev: str, work: Path) -> ctypes.CDLL:
    """int8_rows.c and its headers as they were at ``rev``, built as the engine builds them."""
    for name in ("int8_rows.c", "int8_rows_quant.h", "bf16.h"):
        text = subprocess.run(["git", "show", f"{rev}:engine/native/{name}"], check=True, capture_output=True).stdout
        (work / name).write_bytes(text)
    lib = native.load(f"int8_rows-{rev}", work / "int8_rows.c", (work / "int8_rows_quant.h", work / "bf16.h"))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    for sfx in ("f32", "bf16"):
        getattr(lib, f"int8_scale_{sfx}").argtypes = [p, i64, i64, p, p, p, p, i64, i64]
    return lib


def epilogue(rev: str) -> dict:
    new = int8_kernel.library()
    with tempfile.TemporaryDirectory() as tmp:
        old = old_int8_library(rev, Path(tmp))
        sums = torch.randint(-(2 ** 20), 2 ** 20, (2048, 1536), dtype=torch.int32)
        x_scale, w_scale = torch.rand(2048), torch.rand(1536)
        y = {dt: torch.empty(2048, 1536, dtype=dt) for dt in (torch.float32, torch.bfloat16)}

        def call(lib, dt):
            fn = getattr(lib, f"int8_scale_{int8_kernel.SUFFIX[dt]}")
            return lambda: fn(sums.data_ptr(), 2048, 1536, x_scale.data_ptr(), w_scale.data_ptr(), None,
                              y[dt].data_ptr(), 1536, native.threads())

        return median_us({"bfloat16 before": call(old, torch.bfloat16), "bfloat16 now": call(new, torch.bfloat16),
                          "float32 before": call(old, torch.float32), "float32 now": call(new, torch.float32)})


def written_weight(dtype: torch.dtype, rows_list: list[int]) -> dict:
    out = {}
    for n, k in SHAPES:
        w = torch.randn(n, k, dtype=dtype)
        for rows in rows_list:
            x = torch.randn(rows, k, dtype=dtype)
            fns = {"F.linear": lambda x=x, w=w: F.linear(x, w)}
            if dtype == torch.float32:
                fns["oneDNN, reordered per call"] = lambda x=x, w=w: torch.ops.mkldnn._linear_pointwise(
                    x, torch.ops.mkldnn._reorder_linear_weight(w, batch_size=PACK_ROWS_HINT), None, "none", [], "")
            else:
                fns["weight_major_product"] = lambda x=x, w=w: torch.mm(w, x.t()).t().contiguous()
            out[f"{n}x{k}, {rows} rows"] = median_us(fns)
            print(dtype, n, k, rows, out[f"{n}x{k}, {rows} rows"], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default="cf63480", help="the revision whose int8_rows.c rounded bfloat16 per lane")
    ap.add_argument("--out", default="bench/published")
    args = ap.parse_args()
    result = {"command": " ".join(sys.argv), "cpu": cpu_info() | simd_flags(), "unit": "microseconds, median of 9"}
    with torch.inference_mode():
        result["epilogue 2048 x 1536"] = epilogue(args.before)
        print(result["epilogue 2048 x 1536"], flush=True)
        result["float32"] = written_weight(torch.float32, [64, 256, 2048])
        result["bfloat16"] = written_weight(torch.bfloat16, [64, 256, 2048])
    write_result(args.out, "product-paths", result)


if __name__ == "__main__":
    main()
