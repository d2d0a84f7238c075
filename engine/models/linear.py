"""A Linear layer whose weight is prepacked once into oneDNN's blocked layout on the CPU.

MKL multiplies an unpacked weight every step, and the few-row products of a decode step in
the long tail of a batch job sit well above their bandwidth bound that way (the LM head at 4
rows: 3-7x). ``pack()`` reorders the weight once (``torch.ops.mkldnn._reorder_linear_weight``)
and ``forward`` calls ``_linear_pointwise`` on it, the path vLLM's CPU backend takes through its
own oneDNN helper. 16-bit weights are packed in bfloat16 where the CPU has native bf16 dot
products (avx512_bf16 or AMX: oneDNN uses them at every row count), otherwise as a float32
copy: without them torch's bf16 matmul was measured at about 1 GFLOP/s on an AVX2-only EPYC.

Without AMX, whether bfloat16 products beat float32 at many rows depends on the CPU, so it is
measured once per process (``bf16_beats_float32``): on an Intel Xeon with avx512_bf16 but no
AMX oneDNN's bfloat16 products ran at about 160 GFLOP/s against 300 for float32 (2 cores,
64-2048 rows), while on an AMD EPYC (Zen 5) they ran at 2.2x float32 at every row count. Where
bfloat16 loses, the weight also gets a packed float32 copy used above ``BF16_MAX_ROWS`` rows; at
a few rows, where a product only streams its weight, the bfloat16 copy is faster for having half
the bytes. Either way products accumulate in float32 and the output is rounded to bfloat16:
only the summation order differs.

Where a product has only a few rows it streams its weight, and two faster paths than the packed
product exist, each measured on one CPU vendor (``float32_mkl_max_rows``, ``few_rows_kernel``): on Intel, float32 through
MKL's own F.linear; on AMD with AVX-512 (or AVX2, float32), the C kernel ``engine/native/few_rows.c``,
which reads the weight in place as one linear stream per output row (per model pass of 121 products
at 1 row: bfloat16 7.5 vs 9.1 ms, float32 13.9 vs 16.5; bench/published/probe-products-20261124-043206.json;
AVX2: float32 31 vs 46-51 ms, probe-products-20261126-114827.json).

Unpacked (no oneDNN, another device, or ``pack()`` not called) it falls back to choosing the
faster orientation of the MKL product: ``W @ x.T`` up to 256 rows, ``F.linear`` beyond.
"""

from __future__ import annotations

import functools
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from engine import native
from engine.cpu_info import cpu_flags, cpu_vendor, has_amx

WEIGHT_MAJOR_MAX_ROWS = 256  # unpacked float32: up to this many rows, W @ x.T is the faster product
PACK_ROWS_HINT = 64  # the row count oneDNN tunes the packed layout for (any count still works)
BF16_MAX_ROWS = 8  # above this many rows a bfloat16 weight multiplies as its float32 copy, where bf16 loses
# On Intel, up to this many rows a float32 weight multiplies unpacked through MKL's F.linear:
# the model's 121 products at 1 row took 21.7 ms that way against 28.8 ms packed, 25.0 vs 30.3
# at 2 rows, and packed won from 4 rows (Xeon with AMX, 2 threads). On AMD, MKL took 34.8 ms
# against 16.8 packed at 1 row (bench/probe_products.py), so there every product is packed.
INTEL_FLOAT32_MKL_MAX_ROWS = 2
BF16_PRODUCTS_ENV = "TOKENMILL_BF16_PRODUCTS"  # "bfloat16" or "float32" overrides the measurement


# On AMD with AVX-512, up to this many rows a product goes through few_rows.c. It beat oneDNN
# packed up to 4 rows in bfloat16 and 2 rows in float32 in every probe run of the final kernel
# (JSON: bench/published/probe-products-20261124-043206.json); at 8 rows it lost in one run.
AMD_FEW_ROWS_MAX = {torch.bfloat16: 4, torch.float32: 2}
# On AMD with AVX2 only, its 8-lane build beat oneDNN's packed float32 product at every row count
# it takes, 1-8 rows: 1.2-1.7x per pass in two probe runs (bench/published/probe-products-20261126-114827.json,
# -114846.json). bfloat16 weights are products on a float32 copy there (no native bfloat16).
AMD_AVX2_FEW_ROWS_MAX = {torch.float32: 8}
_FEW_ROWS_FN = {torch.float32: "few_rows_f32", torch.bfloat16: "few_rows_bf16"}


def few_rows_limit(dtype: torch.dtype) -> int:
    """Up to how many rows a ``dtype`` product takes few_rows.c where ``few_rows_kernel`` finds it."""
    return (AMD_FEW_ROWS_MAX if "avx512f" in cpu_flags() else AMD_AVX2_FEW_ROWS_MAX).get(dtype, 0)


@functools.cache
def float32_mkl_max_rows() -> int:
    """Up to how many rows a float32 product skips the packed weight for MKL's own (Intel only)."""
    return INTEL_FLOAT32_MKL_MAX_ROWS if cpu_vendor() == "GenuineIntel" else 0


@functools.cache
def few_rows_kernel(dtype: torch.dtype):
    """The few_rows.c function for ``dtype`` where this CPU runs it (AMD with AVX-512, and
    avx512_bf16 for bfloat16; AMD with AVX2 and FMA, float32), else None."""
    if cpu_vendor() != "AuthenticAMD" or few_rows_limit(dtype) == 0:
        return None
    lib = native.few_rows()  # -march=native: it defines only the functions this CPU can run
    return None if lib is None else getattr(lib, _FEW_ROWS_FN[dtype], None)


def few_rows(x: torch.Tensor, weight: torch.Tensor, fn) -> torch.Tensor:
    """``x @ weight.T`` through the few_rows.c function ``fn`` (shapes checked by the caller)."""
    rows, out = x.shape[0], weight.shape[0]
    y = torch.empty(rows, out, dtype=x.dtype)
    if fn(x.data_ptr(), x.stride(0), weight.data_ptr(), y.data_ptr(), out, rows, x.shape[1], out, native.threads()):
        raise ValueError(f"few_rows: unsupported product of {rows} rows by {tuple(weight.shape)}")
    return y


@functools.cache
def fast_16bit_gemm() -> bool:
    """Whether this CPU has native bfloat16 matmuls (oneDNN with avx512_bf16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


@functools.cache
def can_pack() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


@functools.cache
def bf16_beats_float32() -> bool:
    """Whether oneDNN's packed bfloat16 products beat its float32 ones at many rows here.

    True with AMX. Otherwise measured once: a 256-row product of the MLP's shape, packed, in
    both dtypes, alternating, median of 5 each (about 10 ms). The two CPUs measured so far
    differ by 2x in opposite directions, so noise does not decide it. ``TOKENMILL_BF16_PRODUCTS``
    set to ``bfloat16`` or ``float32`` skips the measurement.
    """
    forced = os.environ.get(BF16_PRODUCTS_ENV, "")
    if forced in ("bfloat16", "float32"):
        return forced == "bfloat16"
    if has_amx():
        return True
    if not (can_pack() and fast_16bit_gemm()):
        return False
    times: dict[torch.dtype, list[float]] = {torch.float32: [], torch.bfloat16: []}
    inputs = {}
    for dtype in times:
        w = torch.ops.mkldnn._reorder_linear_weight(torch.randn(1536, 576, dtype=dtype), batch_size=PACK_ROWS_HINT)
        inputs[dtype] = (torch.randn(256, 576, dtype=dtype), w)
        torch.ops.mkldnn._linear_pointwise(*inputs[dtype], None, "none", [], "")
    for _ in range(5):
        for dtype, (x, w) in inputs.items():
            t = time.perf_counter()
            torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
            times[dtype].append(time.perf_counter() - t)
    return statistics.median(times[torch.bfloat16]) < statistics.median(times[torch.float32])


def compute_dtype(weight_dtype: torch.dtype) -> torch.dtype:
    """The dtype products of a model in ``weight_dtype`` run in on this CPU."""
    if weight_dtype == torch.bfloat16 and fast_16bit_gemm():
        return torch.bfloat16
    return torch.float32


class Linear(nn.Linear):
    packed: torch.Tensor | None = None
    packed_bias: torch.Tensor | None = None
    packed_f32: torch.Tensor | None = None  # float32 copy of a bfloat16 weight, for many rows
    packed_bias_f32: torch.Tensor | None = None
    weight_f32: torch.Tensor | None = None
    few_rows_max: int = 0  # up to this many rows, few_rows_fn computes the product (set by pack)
    few_rows_fn = None

    def pack(self) -> bool:
        """Reorder the weight for oneDNN (a copy: the parameter itself is left as it is).
        Returns False where the CPU build cannot; call again after changing the weight."""
        self.packed = self.packed_bias = self.packed_f32 = self.packed_bias_f32 = None
        self.few_rows_max, self.few_rows_fn = 0, None
        if not can_pack() or self.weight.device.type != "cpu":
            return False
        dtype = compute_dtype(self.weight.dtype)
        self.packed, self.packed_bias = self._packed_as(dtype)
        w = self.weight
        fn = few_rows_kernel(w.dtype) if dtype == w.dtype else None
        if fn is not None and self.bias is None and w.is_contiguous() and w.shape[1] % 32 == 0 and w.shape[0] % 16 == 0:
            self.few_rows_max, self.few_rows_fn = few_rows_limit(w.dtype), fn
        if dtype == torch.bfloat16 and not bf16_beats_float32():
            self.packed_f32, self.packed_bias_f32 = self._packed_as(torch.float32)
        return True

    def _packed_as(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
        w = self.weight.detach().to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, batch_size=PACK_ROWS_HINT)
        return packed, None if self.bias is None else self.bias.detach().to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.device.type != "cpu":
            return F.linear(x, self.weight, self.bias)
        rows = x.shape[0]
        if 0 < rows <= self.few_rows_max and x.dtype == self.weight.dtype and x.stride(1) == 1:
            return few_rows(x, self.weight, self.few_rows_fn)
        if rows <= float32_mkl_max_rows() and self.weight.dtype == x.dtype == torch.float32:
            return F.linear(x, self.weight, self.bias)
        if self.packed_f32 is not None and rows > BF16_MAX_ROWS:
            out = torch.ops.mkldnn._linear_pointwise(x.float(), self.packed_f32, self.packed_bias_f32, "none", [], "")
            return out.to(x.dtype)
        if self.packed is not None:
            if x.dtype == self.packed.dtype:  # the common case: skip two no-op casts (a decode step has ~120 products)
                return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.packed_bias, "none", [], "")
            out = torch.ops.mkldnn._linear_pointwise(
                x.to(self.packed.dtype), self.packed, self.packed_bias, "none", [], ""
            )
            return out.to(x.dtype)
        return self._unpacked(x)

    def _unpacked(self, x: torch.Tensor) -> torch.Tensor:
        rows, weight = x.shape[0], self.weight
        if weight.dtype != torch.float32:
            if compute_dtype(weight.dtype) != torch.float32:
                return F.linear(x, weight, self.bias)
            if self.weight_f32 is None or self.weight_f32.shape != weight.shape:
                self.weight_f32 = weight.detach().float()
            weight = self.weight_f32
        if rows > WEIGHT_MAJOR_MAX_ROWS:
            out = F.linear(x.to(weight.dtype), weight, None).to(x.dtype)
            return out + self.bias if self.bias is not None else out
        cols = (x if rows > 1 else x.repeat(2, 1)).to(weight.dtype)  # one column takes the slow GEMV path
        out = torch.mm(weight, cols.t()).t()[:rows].to(x.dtype)
        return out + self.bias if self.bias is not None else out


def float32_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` in float32 of a weight written for the call (``Int4Linear`` beyond its
    kernel's rows). On AMD through oneDNN, the weight reordered for the call: MKL's F.linear ran at
    about half its speed there, the reorder included (2-core Zen 5, 64 / 256 / 2,048 rows: 3072 x 576
    1,096 / 2,410 / 15,318 us against 1,290 / 4,484 / 33,872; 576 x 1536 506 / 1,230 / 8,286 against
    592 / 2,118 / 16,620; bench/published/product-paths-20261208-030034.json). Elsewhere MKL's F.linear."""
    if cpu_vendor() == "AuthenticAMD" and can_pack():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, batch_size=PACK_ROWS_HINT)
        return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    return F.linear(x, weight)


def pack_linears(model: nn.Module) -> int:
    """Prepack every ``Linear`` of a CPU model; returns how many were packed."""
    return sum(m.pack() for m in model.modules() if isinstance(m, Linear))
