"""FP8 (E4M3) W8A8 linears: an FP8 checkpoint's weights kept as stored, products in FP8.

``Fp8Linear`` holds the weight as ``float8_e4m3fn`` [out, in] with one float32 scale per output
channel (a per-tensor checkpoint scale is repeated per channel). Each call quantizes its input
per row (token) to E4M3 with ``scale = absmax / 448`` (compressed-tensors' dynamic per-token
scheme; a checkpoint's static ``input_scale`` is not used: per-token scales are at least as
fine) and runs ``torch._scaled_mm(x_fp8, w_fp8.t(), scale_a=[M, 1], scale_b=[1, N])``, which
applies both scales to the float32 sums inside the GEMM (row-wise scaling: on CUDA, compute
capability 8.9 or later; torch 2.13's CPU build runs it too, which is how it is tested here).

The product's output is bfloat16 (the one output dtype every CUDA row-wise kernel takes), cast to
the input's dtype; a bfloat16 model's bias is added inside the GEMM, other dtypes' after the cast. Row-wise
``_scaled_mm`` needs ``in`` and ``out`` divisible by 16: other shapes raise ``ValueError`` and the
loader leaves that linear in float.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from engine.quant.fp8_format import FP8, quantize_fp8_rows


@dataclass
class Fp8Weight:
    """``weight[o, i] = values[o, i] * scale[o]``: an FP8 checkpoint linear as stored."""

    values: torch.Tensor  # float8_e4m3fn [out, in]
    scale: torch.Tensor  # float32 [out, 1]

    def dequantize(self) -> torch.Tensor:
        return self.values.float() * self.scale

    @staticmethod
    def cat(parts: list[Fp8Weight]) -> Fp8Weight:
        """Several checkpoint linears stacked along the output (q/k/v, gate/up) as one."""
        if len(parts) == 1:
            return parts[0]
        return Fp8Weight(torch.cat([p.values for p in parts]), torch.cat([p.scale for p in parts]))


def quantize_fp8_channels(weight: torch.Tensor) -> Fp8Weight:
    """A float weight [out, in] quantized per output channel (what llm-compressor's FP8 schemes
    write: ``scale = absmax / 448``); used to make FP8 models from float ones in benches and tests."""
    values, scale = quantize_fp8_rows(weight)
    return Fp8Weight(values, scale)


class Fp8Linear(nn.Module):
    """E4M3 weight per output channel x E4M3 input per row, scales applied inside ``_scaled_mm``."""

    def __init__(self, fw: Fp8Weight, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = fw.values.shape
        if self.out_features % 16 or self.in_features % 16:
            raise ValueError(f"Fp8Linear needs in and out divisible by 16, got {list(fw.values.shape)}")
        if fw.values.dtype != FP8:
            raise ValueError(f"Fp8Linear takes {FP8} weights, got {fw.values.dtype}")
        self.register_buffer("weight", fw.values.contiguous())  # [out, in]; .t() is the column-major B
        scale = fw.scale.float().reshape(-1)
        scale = scale.expand(self.out_features) if scale.numel() == 1 else scale
        self.register_buffer("weight_scale", scale.reshape(1, -1).contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().clone())  # the model's dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        xq, x_scale = quantize_input(x.reshape(-1, self.in_features))
        bias = self.bias
        fused = bias is not None and bias.dtype == torch.bfloat16 and x.dtype == torch.bfloat16
        out = torch._scaled_mm(xq, self.weight.t(), scale_a=x_scale, scale_b=self.weight_scale,
                               bias=bias if fused else None, out_dtype=torch.bfloat16).to(x.dtype)
        if bias is not None and not fused:
            out = out + bias.to(x.dtype)
        return out.reshape(*shape[:-1], self.out_features)

    def dequantized_weight(self) -> torch.Tensor:
        """The float32 weight the product multiplies by."""
        return self.weight.float() * self.weight_scale.t()


def quantize_input(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row E4M3: one Triton launch on CUDA (``fp8_triton.py``), torch ops elsewhere."""
    return _cuda_quantize()(x) if x.is_cuda else quantize_fp8_rows(x)


@functools.cache
def _cuda_quantize():
    """The Triton row quantization, imported once (the torch ops where triton is not installed)."""
    try:
        from engine.quant.fp8_triton import quantize_rows
    except ImportError:  # triton is optional
        return quantize_fp8_rows
    return quantize_rows
