"""The W8A8 C kernel (``engine/native/int8_rows.c``) as ``Int8Linear`` calls it.

One call quantizes the rows, computes exact int32 sums against the int8 weight and writes the
scaled result in x's dtype, on any x86 CPU with AVX2 (vpmaddwd; vpdpbusd where there is VNNI).
Around ``torch._int_mm`` (many rows on VNNI CPUs) it supplies the two passes the eager ops took a
dozen for: the rows quantized to int8, and the int32 sums scaled into the output.

``build(march)`` compiles another instruction set's copy (``haswell``: AVX2, ``skylake-avx512``:
AVX-512 without VNNI, ``alderlake``: AVX-VNNI) so that tests and probes can run each path on a
CPU that has them all.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from pathlib import Path

import torch

from engine import native

SOURCE = Path(native.__file__).with_name("int8_rows.c")
INCLUDES = (SOURCE.with_name("int8_rows_quant.h"), SOURCE.with_name("bf16_store.h"), native.BF16_HEADER)
SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
IN_MULTIPLE, OUT_MULTIPLE = 64, 16  # the shapes the kernel takes (int8_rows.c's bad_shape)


def build(march: str | None = None) -> ctypes.CDLL | None:
    """The library for this CPU (``-march=native``), or for ``march``; None without a compiler,
    with ``TOKENMILL_CPU_KERNELS=0``, or where the CPU has no AVX2 (no function defined)."""
    flags = native.FLAGS if march is None else [f"-march={march}" if f == "-march=native" else f for f in native.FLAGS]
    lib = native.load("int8_rows" + ("" if march is None else f"-{march}"), SOURCE, INCLUDES, flags)
    if lib is None or not hasattr(lib, "int8_rows_isa"):
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.int8_rows_isa.restype = ctypes.c_char_p
    lib.int8_rows_sums.argtypes = [p, i64, i64, p, p, p, i64, i64]
    for sfx in SUFFIX.values():
        getattr(lib, f"int8_linear_{sfx}").argtypes = [p, i64, i64, i64, p, p, p, p, p, p, i64, i64, i64]
        getattr(lib, f"int8_quantize_{sfx}").argtypes = [p, i64, i64, i64, p, p, i64]
        getattr(lib, f"int8_scale_{sfx}").argtypes = [p, i64, i64, p, p, p, p, i64, i64]
    for fn in ("int8_rows_sums", *(f"int8_{k}_{s}" for k in ("linear", "quantize", "scale") for s in SUFFIX.values())):
        getattr(lib, fn).restype = ctypes.c_int
    # looked up once: a decode step makes ~120 of these calls
    lib.by_dtype = {kind: {dt: getattr(lib, f"int8_{kind}_{sfx}") for dt, sfx in SUFFIX.items()}
                    for kind in ("linear", "quantize", "scale")}
    return lib


@functools.cache
def library() -> ctypes.CDLL | None:
    return build()


def isa(lib: ctypes.CDLL) -> str:
    """Which dot product the library runs: avx512-vnni, avx512-bw, avx-vnni or avx2."""
    return lib.int8_rows_isa().decode()


# With VNNI, up to this many rows a product takes the kernel, beyond torch._int_mm (oneDNN's blocked
# GEMM) with the C quantize and scaling. Per pass of SmolLM2-135M's four shapes on a quiet 2-core
# AMD EPYC Zen 5 (avx512_vnni, 2 threads; bench/probe_int8_route.py,
# bench/published/probe-int8-route-20261208-014317.json) the kernel took 47-260 us at 1-32 rows
# against 69-275 for _int_mm (32 rows: 260 vs 275); _int_mm won from 64 (432 vs 493). An earlier
# probe on a loaded Xeon, before the vector bfloat16 store, put the crossing at 16-32. Without
# VNNI the kernel takes every row count: the other exact route, oneDNN's AVX2 int8 GEMM, returns
# wrong sums, and the float route it replaces (_weight_int8pack_mm) took 30x the kernel's AVX2
# build at 256 rows (747 vs 24 ms, on that Xeon: bench/published/probe-int8-20261128-120842.json).
VNNI_MAX_ROWS = 32


def max_rows(int_gemm: bool) -> int:
    """Up to how many rows ``Int8Linear`` calls the kernel (``int_gemm``: torch._int_mm is exact here)."""
    return VNNI_MAX_ROWS if int_gemm else sys.maxsize


def fits(out_features: int, in_features: int) -> bool:
    return in_features % IN_MULTIPLE == 0 and out_features % OUT_MULTIPLE == 0 and in_features < 65536


def compensation(weight: torch.Tensor) -> torch.Tensor:
    """``128 * sum_i w[o, i]`` per output: what the VNNI path's +128 shift of the rows adds."""
    return (weight.to(torch.int32).sum(dim=1) * 128).to(torch.int32).contiguous()


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _check(rc: int, what: str) -> None:
    if rc:
        raise ValueError(f"int8_rows: {what} refused (code {rc})")


def linear(lib: ctypes.CDLL, x: torch.Tensor, weight: torch.Tensor, comp: torch.Tensor, w_scale: torch.Tensor,
           bias: torch.Tensor | None) -> torch.Tensor:
    """``quantize_rows(x)`` times the int8 ``weight`` [out, in], scaled by the row and ``w_scale``
    (float32 [out]) scales, plus the float32 ``bias``, in x's dtype (float32 or bfloat16, rows
    with unit stride)."""
    rows, out = x.shape[0], weight.shape[0]
    y = torch.empty(rows, out, dtype=x.dtype)
    x_scale = torch.empty(rows, dtype=torch.float32)
    rc = lib.by_dtype["linear"][x.dtype](
        x.data_ptr(), x.stride(0), rows, x.shape[1], weight.data_ptr(), comp.data_ptr(), w_scale.data_ptr(),
        _ptr(bias), x_scale.data_ptr(), y.data_ptr(), out, out, native.threads())
    _check(rc, f"a product of {rows} rows by {tuple(weight.shape)}")
    return y


def quantize(lib: ctypes.CDLL, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_rows(x)`` in one pass: (int8 rows, float32 [rows, 1] scales)."""
    rows, cols = x.shape
    q = torch.empty(rows, cols, dtype=torch.int8)
    scale = torch.empty(rows, 1, dtype=torch.float32)
    rc = lib.by_dtype["quantize"][x.dtype](
        x.data_ptr(), x.stride(0), rows, cols, q.data_ptr(), scale.data_ptr(), native.threads())
    _check(rc, f"quantizing {rows} x {cols}")
    return q, scale


def scale(lib: ctypes.CDLL, sums: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
          bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """int32 ``sums`` [rows, out] (contiguous) to ``sums * x_scale * w_scale + bias`` in ``dtype``."""
    rows, out = sums.shape
    y = torch.empty(rows, out, dtype=dtype)
    rc = lib.by_dtype["scale"][dtype](
        sums.data_ptr(), rows, out, x_scale.data_ptr(), w_scale.data_ptr(), _ptr(bias), y.data_ptr(), out,
        native.threads())
    _check(rc, f"scaling {rows} x {out} sums")
    return y


def sums(lib: ctypes.CDLL, q: torch.Tensor, weight: torch.Tensor, comp: torch.Tensor) -> torch.Tensor:
    """The int32 sums ``q @ weight.T`` of int8 rows ``q`` (contiguous): the tests' view of the kernel."""
    rows, out = q.shape[0], weight.shape[0]
    s = torch.empty(rows, out, dtype=torch.int32)
    rc = lib.int8_rows_sums(q.data_ptr(), rows, q.shape[1], weight.data_ptr(), comp.data_ptr(), s.data_ptr(), out,
                            native.threads())
    _check(rc, f"sums of {rows} rows by {tuple(weight.shape)}")
    return s
