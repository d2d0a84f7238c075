"""A Linear layer that picks the faster orientation of the product on the CPU.

MKL computes ``x @ W.T`` markedly slower than the same product as ``W @ x.T`` when ``x`` has
few rows, and a decode step in the long tail of a batch job is exactly that shape. Measured
on this project's 2-core machines (float32, ``bench`` shapes of SmolLM2): at 18 rows the MLP
projection takes 0.80 vs 0.97 ms, at 64 rows 1.51 vs 2.03 ms, and the 49,152-wide LM head at
4 rows 5.7 vs 22 ms; from about 256 rows on the two are level, so prefill keeps ``F.linear``.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

WEIGHT_MAJOR_MAX_ROWS = 256  # float32: up to this many rows, W @ x.T is the faster product
SMALL_BATCH_16BIT = 8  # 16-bit: up to this many rows a float32 copy of the weight beats bf16 kernels


@functools.cache
def fast_16bit_gemm() -> bool:
    """Whether this CPU has native bfloat16 matmuls (oneDNN with avx512_bf16 or AMX). Without
    them torch falls back to a path measured here at about 1 GFLOP/s (AVX2-only EPYC), a
    hundred times slower than float32, so 16-bit weights are multiplied as float32 copies."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


class Linear(nn.Linear):
    """In 16-bit models a float32 copy of the weight serves the few-row products: CPU
    bfloat16 kernels reach only a few GB/s there, far below the float32 path's bandwidth.
    Beyond a few rows the native bfloat16 kernels win where the CPU has them (the reference
    AVX-512 machine: twice the float32 FLOP rate); elsewhere every product uses the copy."""

    weight_f32: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if x.dim() != 2 or x.device.type != "cpu":
            return F.linear(x, self.weight, self.bias)
        weight = self.weight
        if weight.dtype != torch.float32:
            if rows > SMALL_BATCH_16BIT and fast_16bit_gemm():
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
