"""Group-wise int8 weights (GGUF Q8_0, Q5_0: int8 values with one float16 scale per 32 columns),
multiplied weight-only.

Group scales do not fit ``torch._int_mm``'s one scale per output row, so two ways were measured
(``docs/performance/quantization.md``, "GGUF as stored"): int8 x int8 per group (one ``_int_mm`` per
32 columns, the int32 sums scaled and added) and the weight dequantised per call. The int8 x int8
route also rounds the activations to int8 (W8A8, not the stored model's product) and needs VNNI to be
exact; the weight-only route is exact: ``q * d`` of an int8 and a float16 is exact in float32, so
the weight each call multiplies by is bit-for-bit gguf's dequantisation (rounded to the model's
dtype, as the dequantised model's weight is), at 1.06 bytes per weight instead of 2 or 4.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.quant import group_int8_kernel
from engine.quant.checkpoint import QuantWeight


class GroupInt8Linear(nn.Module):
    """int8 values ``[out, in]`` and scales ``[out, in / group]``: ``w = values * scale`` per group."""

    def __init__(self, qw: QuantWeight, bias: torch.Tensor | None) -> None:
        super().__init__()
        if qw.zero is not None or qw.offset is not None or qw.values.shape[1] % qw.group_size:
            raise ValueError("GroupInt8Linear takes symmetric int8 values in whole groups")
        self.out_features, self.in_features = qw.values.shape
        self.group_size = qw.group_size
        scale = qw.scale.float()
        half = scale.half()
        exact_half = bool(torch.equal(half.float(), scale))  # GGUF's scales are float16: stored as such
        self.register_buffer("values", qw.values.to(torch.int8).contiguous())
        self.register_buffer("scale", (half if exact_half else scale).contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float())
        fits = group_int8_kernel.fits(self.out_features, self.in_features, self.group_size, self.scale)
        self.kernel = group_int8_kernel.library() if fits else None

    def dequantized_weight(self) -> torch.Tensor:
        """The float32 weight: int8 x float16 products, exact in float32."""
        grouped = self.values.view(self.out_features, -1, self.group_size)
        return torch.mul(grouped, self.scale.float().unsqueeze(-1)).view(self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (self.kernel is not None and x.dim() == 2 and 0 < x.shape[0] <= group_int8_kernel.MAX_ROWS
                and x.dtype in group_int8_kernel.SUFFIX and x.stride(1) == 1):
            out = group_int8_kernel.product(self.kernel, x, self.values, self.scale)
        else:
            w = self.dequantized_weight()
            out = F.linear(x, w if x.dtype == torch.float32 else w.to(x.dtype))
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out
