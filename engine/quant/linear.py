"""The CPU products of quantized linears.

``Int8Linear`` (W8A8): each row of the input is quantized to int8 with its own scale
(``absmax / 127``, symmetric, as compressed-tensors' dynamic per-token scheme), multiplied by the
int8 weight with int32 accumulation (``torch._int_mm``: oneDNN's s8 x s8 GEMM, ``vpdpbusd`` on
AVX-512 VNNI and AVX-VNNI CPUs), and the int32 sums are scaled by ``x_scale[m] * w_scale[n]`` in
float32. The sums are exact, so the result equals the float product of the rounded input and
the dequantised weight up to float rounding.

Without VNNI the int8 GEMM is not used: with oneDNN capped to AVX2 (``ONEDNN_MAX_CPU_ISA=AVX2``,
its ``vpmaddubsw`` kernels) ``torch._int_mm`` returned wrong sums for 99.99% of a random
64x576x1536 product (off by up to 117,284 of 592,186). There the rounded input (same rounding)
is multiplied in float by the int8 weight, dequantised per channel inside
``_weight_int8pack_mm``: the same result up to float rounding, at int8 weight bytes.

``Int4Linear`` (W4A16): the weight stays 4-bit in torch's CPU int4 layout
(``_convert_weight_to_int4pack_for_cpu``), group-wise float32 scales and zero points, and
``_weight_int4pack_mm_for_cpu`` dequantises each block in registers as it multiplies (float32
inputs, so scales keep their float32 precision; a bfloat16 model's rows are widened first).
"""

from __future__ import annotations

import functools
import os

import torch
from torch import nn

from engine.cpu_info import cpu_flags
from engine.quant import int8_kernel
from engine.quant.checkpoint import QuantWeight

INT8_MAX = 127.0


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(int8 rows, float32 [rows, 1] scales)``: symmetric, one scale per row (token)."""
    x32 = x.float()
    scale = x32.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12).div_(INT8_MAX)
    return torch.round(x32 / scale).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8), scale


VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
AVX2_CAPS = ("SSE41", "AVX", "AVX2")  # ONEDNN_MAX_CPU_ISA values that keep oneDNN off VNNI


@functools.cache
def exact_int8_gemm() -> bool:
    """Whether ``torch._int_mm`` runs on int8 dot-product instructions here (and so is exact)."""
    flags = cpu_flags()
    capped = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() in AVX2_CAPS
    return any(f in flags for f in VNNI_FLAGS) and not capped


class Int8Linear(nn.Module):
    """int8 weight per output channel x int8 input per row, int32 sums: the C kernel of
    ``int8_kernel`` (any AVX2 CPU) up to ``kernel_max_rows`` rows, ``torch._int_mm`` beyond with
    VNNI (quantize and scaling in C), float sums of the rounded rows where neither runs."""

    def __init__(self, qw: QuantWeight, bias: torch.Tensor | None) -> None:
        super().__init__()
        if qw.zero is not None or qw.group_size != qw.values.shape[1]:
            raise ValueError("Int8Linear takes symmetric per-channel int8 weights")
        self.out_features, self.in_features = qw.values.shape
        self.int_gemm = exact_int8_gemm()
        self.kernel = int8_kernel.library() if int8_kernel.fits(self.out_features, self.in_features) else None
        self.kernel_max_rows = int8_kernel.max_rows(self.int_gemm) if self.kernel is not None else 0
        self.register_buffer("weight", qw.values.contiguous())  # [out, in]: the kernel's layout; _int_mm takes .t()
        self.register_buffer("comp", None if self.kernel is None else int8_kernel.compensation(self.weight))
        self.register_buffer("weight_scale", qw.scale.reshape(-1).float().contiguous())  # [out]
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lib = self.kernel
        if lib is not None and x.dim() == 2 and x.dtype in int8_kernel.SUFFIX and x.stride(1) == 1:
            if 0 < x.shape[0] <= self.kernel_max_rows:
                return int8_kernel.linear(lib, x, self.weight, self.comp, self.weight_scale, self.bias)
            if self.int_gemm:
                xq, x_scale = int8_kernel.quantize(lib, x)
                sums = torch._int_mm(xq, self.weight.t())
                return int8_kernel.scale(lib, sums, x_scale, self.weight_scale, self.bias, x.dtype)
        xq, x_scale = quantize_rows(x)
        if self.int_gemm:
            out = torch._int_mm(xq, self.weight.t()).float().mul_(x_scale).mul_(self.weight_scale)
        else:
            out = torch.ops.aten._weight_int8pack_mm(xq.float() * x_scale, self.weight, self.weight_scale)
        if self.bias is not None:
            out.add_(self.bias)
        return out.to(x.dtype)

    def dequantized_weight(self) -> torch.Tensor:
        return self.weight.float() * self.weight_scale.unsqueeze(1)


class Int4Linear(nn.Module):
    """4-bit weight per group, scales and zero points in bfloat16, 16-bit inputs.

    Up to ``KERNEL_MAX_ROWS`` rows the product is torch's int4 kernel on the packed weight (it
    reads half a byte per weight); beyond, the weight is unpacked to the input's dtype for that one
    call and multiplied by oneDNN/MKL (the unpacking is amortised over the rows; torch's int4
    kernel was 2x slower than a bfloat16 product at 64 rows and 15x at 256 here, while unpacking a
    3072 x 576 weight in torch ops took 1.6 ms, best of 9; a plain C loop took 24). Inputs are
    rounded to bfloat16 (A16) either way, so both paths multiply ``dequantized_weight()`` by the
    same bfloat16 input; the kernel also rounds its output to bfloat16.
    """

    BLOCK = 64  # torch's CPU int4 layout packs 64 output rows per block: [K, 32] bytes, low nibble row j, high j+32

    def __init__(self, qw: QuantWeight, bias: torch.Tensor | None) -> None:
        super().__init__()
        out, cols = qw.values.shape
        if out % self.BLOCK or cols % qw.group_size:
            raise ValueError(f"Int4Linear needs rows in blocks of {self.BLOCK} and whole groups, got {out}x{cols}")
        self.out_features, self.in_features, self.group_size = out, cols, qw.group_size
        unsigned = (qw.values.int() + 8).contiguous()  # torch's int4 layout: w = (u - 8) * scale + zero
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(unsigned, 1))
        zero = torch.zeros_like(qw.scale) if qw.zero is None else -qw.zero.float() * qw.scale  # (q - zp) * s
        if qw.offset is not None:  # GGUF's float minimum: (q - zp) * s + offset
            zero = zero + qw.offset
        sz = torch.stack([qw.scale.float().t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous()
        self.register_buffer("scales_and_zeros", sz)  # [groups, out, 2]
        self.register_buffer("bias", None if bias is None else bias.detach().float())

    KERNEL_MAX_ROWS = 16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xb = x.to(torch.bfloat16)
        if x.shape[0] <= self.KERNEL_MAX_ROWS:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, self.packed, self.group_size, self.scales_and_zeros)
        elif x.dtype == torch.bfloat16:
            out = torch.nn.functional.linear(xb, self.dequantized_weight().to(torch.bfloat16))
        else:
            out = torch.nn.functional.linear(xb.float(), self.dequantized_weight())
        if self.bias is not None:
            out = out + self.bias
        return out.to(x.dtype)

    def dequantized_weight(self) -> torch.Tensor:
        """The float32 weight the kernel multiplies by (bfloat16 scales and zeros applied)."""
        out, cols, g = self.out_features, self.in_features, self.group_size
        blocks = self.packed.view(out // self.BLOCK, cols, self.BLOCK // 2)
        u = torch.cat([blocks & 15, blocks >> 4], dim=2).transpose(1, 2).reshape(out, cols)
        scale, zero = self.scales_and_zeros.float().permute(2, 1, 0)  # [out, groups] each
        w = (u.float() - 8).unflatten(1, (-1, g)) * scale.unsqueeze(-1) + zero.unsqueeze(-1)
        return w.flatten(1)
