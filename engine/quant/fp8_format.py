"""The FP8 format the quantized paths share: E4M3 (``float8_e4m3fn``), its range, and the
per-row quantization every FP8 product and its tests round with (torch ops; ``fp8_triton.py``
is the one-launch CUDA version of the same rounding)."""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
MIN_AMAX = 1e-12  # an all-zero row (CUDA-graph padding) gets a tiny scale, not 0/0


def quantize_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(E4M3 rows, float32 [rows, 1] scales)``: symmetric, ``absmax / 448`` per row, rounded to
    nearest even (the torch reference of ``fp8_triton.quantize_rows``)."""
    x32 = x.float()
    scale = x32.abs().amax(dim=-1, keepdim=True).clamp_(min=MIN_AMAX).div_(FP8_MAX)
    return (x32 / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8), scale
