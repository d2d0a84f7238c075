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

``Int4Linear`` (weight-only 4-bit): the weight stays 4-bit, group-wise. With the C kernel
(``engine/quant/int4_kernel.py``) its scales and offsets stay float32 and rows keep their dtype
(float32 models included); without it, torch's CPU int4 layout and ``_weight_int4pack_mm_for_cpu``
on bfloat16 rows with bfloat16 scales and zeros (its float32 path is scalar).
"""

from __future__ import annotations

import functools
import os

import torch
from torch import nn

from engine.cpu_info import cpu_flags
from engine.models.linear import float32_product
from engine.quant import int8_kernel
from engine.quant.checkpoint import QuantWeight
from engine.quant.int4_kernel import int4_kernel

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


@functools.cache
def fast_bf16_products() -> bool:
    """Whether the engine multiplies bfloat16 in bfloat16 at many rows here (engine/models/linear.py)."""
    from engine.models.linear import bf16_beats_float32, compute_dtype

    return compute_dtype(torch.bfloat16) == torch.bfloat16 and bf16_beats_float32()


class Int4Linear(nn.Module):
    """4-bit weight per group; float32 scales and offsets with the C kernel, else bfloat16 ones.

    With the C kernel (``engine/quant/int4_kernel.py``: AVX-512 or AVX2 with FMA, and a compiler)
    the weight is ``dequantized_weight()`` exactly, built in float32 registers: up to
    ``C_MAX_ROWS`` rows (``C_MAX_ROWS_16BIT`` for 16-bit rows) the kernel multiplies it into float32
    sums (a bfloat16 result rounded once); beyond, the C kernel writes it out for the call: in float32,
    multiplied into float32 rows by MKL (by oneDNN on AMD), or, where the engine's bfloat16 products
    are the fast ones, in bfloat16 for bfloat16 rows (the dequantised bfloat16 model's weight, multiplied
    unpacked by F.linear, so in another summation order than that model's packed product).
    So a float32 model keeps its activations, and a GGUF model's weights are its dequantised ones.

    Without it, the weight stays in torch's CPU int4 layout with bfloat16 scales and zeros: up to
    ``KERNEL_MAX_ROWS`` rows torch's int4 kernel on bfloat16 rows (rounding its output to bfloat16
    too); beyond, the weight unpacked in torch ops for the call (torch's int4 kernel was 2x slower
    than a bfloat16 product at 64 rows and 15x at 256 here). ``rounds_to_bfloat16`` says which.
    """

    BLOCK = 64  # torch's CPU int4 layout packs 64 output rows per block: [K, 32] bytes, low nibble row j, high j+32
    KERNEL_MAX_ROWS = 16  # torch's int4 kernel
    # Up to this many rows the C kernel; beyond, the weight written out for the call. float32: the
    # kernel beat writing it + MKL at 1-64 rows and lost at 256 (6.3 vs 7.5 ms, 26 vs 20 per layer,
    # 1 thread); bfloat16 rows: at 16 rows the kernel beat the engine's bfloat16 product's per-call
    # cost, beyond it the 16-bit product (AMX here) wins (docs/performance/quantization.md).
    C_MAX_ROWS = 64
    C_MAX_ROWS_16BIT = 16

    def __init__(self, qw: QuantWeight, bias: torch.Tensor | None) -> None:
        super().__init__()
        out, cols = qw.values.shape
        self.out_features, self.in_features, self.group_size = out, cols, qw.group_size
        kernel = int4_kernel()
        self.kernel = kernel if kernel is not None and kernel.takes(out, cols, qw.group_size) else None
        self.rounds_to_bfloat16 = self.kernel is None
        if self.kernel is not None:
            packed, sz = self.kernel.pack(qw)  # [out, in / 2], [out, in / 32, 2] float32
        else:
            if out % self.BLOCK or cols % qw.group_size:
                raise ValueError(f"Int4Linear needs rows in blocks of {self.BLOCK} and whole groups, got {out}x{cols}")
            unsigned = (qw.values.int() + 8).contiguous()  # torch's int4 layout: w = (u - 8) * scale + zero
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(unsigned, 1)
            zero = torch.zeros_like(qw.scale) if qw.zero is None else -qw.zero.float() * qw.scale  # (q - zp) * s
            if qw.offset is not None:  # GGUF's float minimum: (q - zp) * s + offset
                zero = zero + qw.offset
            sz = torch.stack([qw.scale.float().t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous()  # [groups, out, 2]
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", sz)
        self.register_buffer("bias", None if bias is None else bias.detach().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self._c_product(x) if self.kernel is not None else self._torch_product(x)
        if self.bias is not None:
            out = out + self.bias
        return out.to(x.dtype)

    def _c_product(self, x: torch.Tensor) -> torch.Tensor:
        sixteen = x.dtype != torch.float32
        if x.shape[0] <= (self.C_MAX_ROWS_16BIT if sixteen else self.C_MAX_ROWS):
            native = x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and self.bias is None)
            xk = x if native and x.stride(-1) == 1 else x.float()  # the bias is added before rounding
            return self.kernel.product(xk, self.packed, self.scales_and_zeros, self.out_features)
        if sixteen and x.dtype == torch.bfloat16 and fast_bf16_products():  # the dequantised model's product
            return torch.nn.functional.linear(x, self.kernel.dequantize(self.packed, self.scales_and_zeros, torch.bfloat16))
        return float32_product(x.float(), self.dequantized_weight())

    def _torch_product(self, x: torch.Tensor) -> torch.Tensor:
        xb = x.to(torch.bfloat16)
        if x.shape[0] <= self.KERNEL_MAX_ROWS:
            return torch.ops.aten._weight_int4pack_mm_for_cpu(xb, self.packed, self.group_size, self.scales_and_zeros)
        if x.dtype == torch.bfloat16:
            return torch.nn.functional.linear(xb, self.dequantized_weight().to(torch.bfloat16))
        return torch.nn.functional.linear(xb.float(), self.dequantized_weight())

    def dequantized_weight(self) -> torch.Tensor:
        """The float32 weight the products multiply by (torch's layout: bfloat16 scales and zeros applied)."""
        if self.kernel is not None:
            return self.kernel.dequantize(self.packed, self.scales_and_zeros)
        out, cols, g = self.out_features, self.in_features, self.group_size
        blocks = self.packed.view(out // self.BLOCK, cols, self.BLOCK // 2)
        u = torch.cat([blocks & 15, blocks >> 4], dim=2).transpose(1, 2).reshape(out, cols)
        scale, zero = self.scales_and_zeros.float().permute(2, 1, 0)  # [out, groups] each
        w = (u.float() - 8).unflatten(1, (-1, g)) * scale.unsqueeze(-1) + zero.unsqueeze(-1)
        return w.flatten(1)
