"""FP8 (E4M3) rounding in Triton: a linear's per-token input quantization in one launch, and the
rounding the FP8 KV cache writes with (``engine/attention/triton_kernels.py``).

``round_e4m3`` rounds float32 values (already within +-448) to the nearest E4M3 value, ties to
even, with float32 arithmetic only, so the final ``.to(float8e4nv)`` converts an exact value. On a
GPU that equals the hardware conversion; it exists because the Triton interpreter's own
float32 -> E4M3 conversion (triton 3.9) drops the carry when rounding up crosses a power of two
(-31.1 became -16, 98 of 4,096 random values wrong), and the interpreter is how these kernels
are tested against torch's conversion on the CPU (tests/engine/test_fp8_kv_cache.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.quant.fp8_format import FP8, FP8_MAX, MIN_AMAX


@triton.jit
def round_e4m3(y):
    """``y`` (float32, |y| <= 448) rounded to E4M3's grid: 3 mantissa bits, subnormal below 2^-6;
    the sign is kept as torch keeps it (a negative value that rounds to zero is -0)."""
    bits = y.to(tl.int32, bitcast=True)
    a = tl.abs(y)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)
    quantum = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)  # 2^(e - 3), exact
    r = ((a / quantum + 12582912.0) - 12582912.0) * quantum  # 1.5 * 2^23: float32 rounds to even
    return (r.to(tl.int32, bitcast=True) | ((bits >> 31) << 31)).to(tl.float32, bitcast=True)


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, stride_x, stride_q, cols, min_amax, fp8_max,
                          BLOCK: tl.constexpr):
    """One row per program: ``scale = max(absmax, min_amax) / 448``, ``q = round(x / scale)``."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    mask = c < cols
    x = tl.load(x_ptr + row * stride_x + c, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0), min_amax) / fp8_max
    y = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -fp8_max), fp8_max)  # IEEE, as torch divides
    tl.store(q_ptr + row * stride_q + c, round_e4m3(y).to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, scale)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """As ``fp8_format.quantize_fp8_rows`` for a 2-D tensor with dense rows: ``(E4M3 [M, K],
    float32 [M, 1])``, in one launch (CUDA, or CPU tensors under the Triton interpreter)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows, cols = x.shape
    q = torch.empty((rows, cols), dtype=FP8, device=x.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    if rows:
        block = triton.next_power_of_2(cols)
        _quantize_rows_kernel[(rows,)](x, q, scale, x.stride(0), q.stride(0), cols, MIN_AMAX, FP8_MAX,
                                       BLOCK=block, num_warps=max(1, min(16, block // 256)))
    return q, scale
