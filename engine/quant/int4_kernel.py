"""The C int4 product (``engine/native/int4_rows.c``): packing a ``QuantWeight`` into its layout,
and the calls, through ctypes.

Why its own kernel: torch's int4 kernel takes bfloat16 rows and scales at speed (its float32 path
is scalar), which rounds a float32 model's activations and each group's scale and zero. This one
keeps them float32: ``w = u * s + z`` with ``u = values + 8`` (0..15), ``s = scale`` and
``z = offset - (8 + zero) * scale``, one FMA per weight. Where ``u * s`` is exact (a 4-bit integer
times GGUF's float16 ``d``, or ``d * sc`` with a 6-bit ``sc``) and ``(8 + zero) * scale`` too (GGUF:
zero -8, or none), that FMA rounds once, as ``QuantWeight.dequantize()`` does: the weight is the
dequantised model's, bit for bit. Symmetric checkpoints (no zero) are exact for any float32 scale
(``z = -8 s`` exactly, and the FMA rounds ``(u - 8) s`` once); asymmetric ones round ``z`` once more.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from engine import native
from engine.quant.checkpoint import QuantWeight

SOURCE = Path(native.__file__).with_name("int4_rows.c")
INCLUDES = (native.BF16_HEADER, SOURCE.with_name("bf16_store.h"), native.AVX512_MATH_HEADER, native.AVX2_MATH_HEADER,
            native.FAST_EXP_HEADER)
SUB = 32  # columns per stored (scale, offset) pair: every group size the kernel takes is a multiple


class Int4Kernel:
    """One build of ``int4_rows.c`` (its vector width decides the packing)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.int4_lanes.restype = ctypes.c_int
        lib.int4_pack.argtypes = [p, i64, i64, p]
        lib.int4_dequant.argtypes = lib.int4_dequant_bf16.argtypes = [p, p, p, i64, i64, i64]
        for name in ("int4_rows_f32", "int4_rows_bf16", "int4_pack", "int4_dequant", "int4_dequant_bf16"):
            getattr(lib, name).restype = ctypes.c_int
        for name in ("int4_rows_f32", "int4_rows_bf16"):
            getattr(lib, name).argtypes = [p, i64, p, p, p, i64, i64, i64, i64, i64]
        self.lib = lib
        self.out_tile = lib.int4_lanes()  # outputs per tile: one vector

    def takes(self, out: int, cols: int, group_size: int) -> bool:
        return out % self.out_tile == 0 and cols % 64 == 0 and group_size % SUB == 0 and cols % group_size == 0

    def pack(self, qw: QuantWeight) -> tuple[torch.Tensor, torch.Tensor]:
        """``(packed uint8 [out, in / 2], float32 [out, in / 32, 2] scale and offset per 32 columns)``."""
        out, cols = qw.values.shape
        u = (qw.values.to(torch.int16) + 8).to(torch.uint8).contiguous()
        packed = torch.empty(out, cols // 2, dtype=torch.uint8)
        if self.lib.int4_pack(u.data_ptr(), out, cols, packed.data_ptr()):
            raise ValueError(f"int4 kernel: {cols} columns are not whole 64-column blocks")
        scale = qw.scale.float()
        shift = 8 * scale if qw.zero is None else (8 + qw.zero.float()) * scale
        z = -shift if qw.offset is None else qw.offset.float() - shift
        per = qw.group_size // SUB
        sz = torch.stack([scale.repeat_interleave(per, 1), z.repeat_interleave(per, 1)], dim=-1)
        return packed, sz.contiguous()

    def product(self, x: torch.Tensor, packed: torch.Tensor, sz: torch.Tensor, out: int) -> torch.Tensor:
        """``x @ w.T`` for a float32 or bfloat16 ``x`` [rows, in] (unit column stride), in its dtype."""
        rows, cols = x.shape
        fn = self.lib.int4_rows_bf16 if x.dtype == torch.bfloat16 else self.lib.int4_rows_f32
        y = torch.empty(rows, out, dtype=x.dtype)
        if fn(x.data_ptr(), x.stride(0), packed.data_ptr(), sz.data_ptr(), y.data_ptr(), out, rows, cols, out,
              native.threads()):
            raise ValueError(f"int4 kernel: unsupported product of {rows} rows by {out}x{cols}")
        return y

    def dequantize(self, packed: torch.Tensor, sz: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float32 weight ``product`` multiplies by, ``[out, in]``; with ``dtype`` bfloat16 that
        weight rounded to bfloat16 (``.to(torch.bfloat16)`` of it, bit for bit) in one pass."""
        out, cols = packed.shape[0], packed.shape[1] * 2
        w = torch.empty(out, cols, dtype=dtype)
        fn = self.lib.int4_dequant_bf16 if dtype == torch.bfloat16 else self.lib.int4_dequant
        if fn(packed.data_ptr(), sz.data_ptr(), w.data_ptr(), out, cols, native.threads()):
            raise ValueError(f"int4 kernel: {cols} columns are not whole 64-column blocks")
        return w


def build(flags: list[str] | None = None, name: str = "int4_rows") -> Int4Kernel | None:
    """A build of the kernel (``flags``: the compiler's, e.g. an AVX2 ``-march`` for tests), or None
    where there is no compiler, ``TOKENMILL_CPU_KERNELS=0``, or neither AVX-512 nor AVX2 with FMA."""
    lib = native.load(name, SOURCE, INCLUDES, flags)
    return None if lib is None or getattr(lib, "int4_rows_f32", None) is None else Int4Kernel(lib)


@functools.cache
def int4_kernel() -> Int4Kernel | None:
    """This CPU's build (``-march=native``), once per process."""
    return build()
