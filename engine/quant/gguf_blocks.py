"""GGUF quantized blocks decoded into integer values and group scales, exactly.

Each type kept as stored becomes a ``QuantWeight`` with group size 32 whose ``dequantize()`` is
bit-for-bit ``gguf.quants.dequantize`` (the same float32 products and sums in the same order;
the bit unpacking is gguf's own expressions, Q4_K's 6-bit scales through ``Q4_K.get_scale_min``):

- Q8_0 ``w = d * q`` (q int8), Q5_0 ``w = d * (q - 16)`` (q 5-bit): int8 values, fp16 ``d`` per 32;
- Q4_0 ``w = d * (q - 8)``: 4-bit values in [-8, 7], scale ``d``;
- Q4_1 ``w = d * q + m`` and Q4_K ``w = (d * sc) * q - dmin * m`` (sub-blocks of 32 in 256-value
  super-blocks, 6-bit ``sc`` and ``m``): values ``q - 8`` with zero point -8 (``q`` again, exactly,
  in float), scale ``d`` or ``d * sc`` and a float offset ``m`` or ``-(dmin * m)`` per group of 32.

Other types (Q6_K, Q5_1, Q5_K, Q2_K/Q3_K, the I-quants, floats) are not decoded here: their
tensors stay dequantised to float, as transformers' conversion wrote them.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import Q4_K

from engine.quant.checkpoint import QuantWeight

GROUP = 32
BITS = {T.Q4_0: 4, T.Q4_1: 4, T.Q4_K: 4, T.Q5_0: 8, T.Q8_0: 8}  # the types kept as stored: their kernel's width
_NIBBLES = np.array([0, 4], dtype=np.uint8).reshape((1, 1, 2, 1))


def _f16(raw: np.ndarray) -> np.ndarray:
    return raw.copy().view(np.float16).astype(np.float32)  # [n, 2] bytes -> [n, 1] float32


def _nibbles(qs: np.ndarray, width: int) -> np.ndarray:
    """Low nibbles then high nibbles of each run of ``width`` bytes (ggml's 4-bit order)."""
    n = qs.shape[0]
    return ((qs.reshape((n, -1, 1, width)) >> _NIBBLES) & np.uint8(0x0F)).reshape((n, -1))


def _group_blocks(blocks: np.ndarray, qtype: T) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, bool]:
    """``(values [n, 32] int8, scale [n, 1], offset [n, 1] or None, values shifted by -8)`` per 32-block."""
    if qtype == T.Q8_0:
        return blocks[:, 2:].copy().view(np.int8), _f16(blocks[:, :2]), None, False
    if qtype == T.Q4_0:
        return _nibbles(blocks[:, 2:], 16).astype(np.int8) - np.int8(8), _f16(blocks[:, :2]), None, False
    if qtype == T.Q4_1:
        q = _nibbles(blocks[:, 4:], 16).astype(np.int8) - np.int8(8)
        return q, _f16(blocks[:, :2]), _f16(blocks[:, 2:4]), True
    if qtype == T.Q5_0:
        n = blocks.shape[0]
        qh = blocks[:, 2:6].copy().view(np.uint32).reshape((n, 1)) >> np.arange(32, dtype=np.uint32).reshape((1, 32))
        qh = (qh & np.uint32(1)).astype(np.uint8)
        q = (_nibbles(blocks[:, 6:], 16) | (qh << np.uint8(4))).astype(np.int8) - np.int8(16)
        return q, _f16(blocks[:, :2]), None, False
    raise ValueError(f"GGUF type {qtype.name} is not kept as stored")


def _q4_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K super-blocks -> ``(values - 8 [n, 256], scale [n, 8], offset [n, 8])``."""
    d, dmin = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
    sc, m = Q4_K.get_scale_min(blocks[:, 4:16].copy())
    scale = d * sc.astype(np.float32)
    offset = -(dmin * m.astype(np.float32))  # gguf subtracts dmin * m; adding its negation is the same sum
    q = _nibbles(blocks[:, 16:], 32).astype(np.int8) - np.int8(8)
    return q, scale, offset


def decode(data: np.ndarray, qtype: T, shape: tuple[int, int]) -> QuantWeight:
    """A GGUF tensor's raw blocks (``GGUFReader``'s uint8 ``[rows, bytes]``) -> ``QuantWeight``
    of ``shape`` (rows, columns) in groups of 32 columns."""
    rows, cols = shape
    if qtype == T.Q4_K:
        q, scale, offset = _q4_k(np.ascontiguousarray(data).reshape(-1, 144))
        shifted = True
    else:
        q, scale, offset, shifted = _group_blocks(np.ascontiguousarray(data).reshape(rows * cols // GROUP, -1), qtype)
    groups = cols // GROUP
    values = torch.from_numpy(np.ascontiguousarray(q)).reshape(rows, cols)
    scale_t = torch.from_numpy(np.ascontiguousarray(scale)).reshape(rows, groups)
    offset_t = None if offset is None else torch.from_numpy(np.ascontiguousarray(offset)).reshape(rows, groups)
    zero = torch.full((rows, groups), -8, dtype=torch.int8) if shifted else None
    return QuantWeight(values, scale_t, zero, GROUP, offset_t)


def permute_rows(qw: QuantWeight, order: torch.Tensor) -> QuantWeight:
    """The same linear with its output rows taken in ``order`` (llama.cpp's q/k row permutation undone)."""
    def pick(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[order].contiguous()

    return QuantWeight(pick(qw.values), pick(qw.scale), pick(qw.zero), qw.group_size, pick(qw.offset))
