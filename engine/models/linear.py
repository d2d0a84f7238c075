"""A Linear layer that stays fast when a decode step has only a few rows.

On the CPU, MKL's path for ``x @ W.T`` with one to eight rows of ``x`` streams the weights at
a third of the memory bandwidth that the same product reaches as ``W @ x.T`` with two or
more columns (measured on this project's 2-core machines: 9 vs 24 GB/s). A decode step in
the long tail of a batch job is exactly that shape, and it is bound by reading the weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SMALL_BATCH = 8


class Linear(nn.Linear):
    """In 16-bit models a float32 copy of the weight serves the few-row products: CPU
    bfloat16 kernels reach only a few GB/s there, far below the float32 path's bandwidth."""

    weight_f32: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if x.dim() != 2 or rows > SMALL_BATCH or x.device.type != "cpu":
            return F.linear(x, self.weight, self.bias)
        weight = self.weight
        if weight.dtype != torch.float32:
            if self.weight_f32 is None or self.weight_f32.shape != weight.shape:
                self.weight_f32 = weight.detach().float()
            weight = self.weight_f32
        cols = (x if rows > 1 else x.repeat(2, 1)).to(weight.dtype)  # one column takes the slow GEMV path
        out = torch.mm(weight, cols.t()).t()[:rows].to(x.dtype)
        return out + self.bias if self.bias is not None else out
