"""A compressed-tensors linear's checkpoint tensors decoded into integer values and scales.

The 4-bit values and zero points are unpacked with compressed-tensors' own ``unpack_from_int32``
(the package ``llm-compressor`` writes them with), so the bit order is theirs by construction.
``QuantWeight.dequantize`` is the float reference every quantized product is tested against and
what ``quantization = "none"`` (and FP8 on the CPU) loads. FP8 weights decode to an ``Fp8Weight``
(``fp8_linear.py``): the E4M3 values as stored and a float32 scale per output channel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.quant.fp8_format import FP8
from engine.quant.fp8_linear import Fp8Weight
from engine.quant.scheme import QuantScheme, WeightFormat

# the tensors a quantized linear stores beside (or instead of) ``weight``
QUANT_SUFFIXES = ("weight_packed", "weight_shape", "weight_scale", "weight_zero_point", "weight_global_scale",
                  "input_scale", "input_zero_point", "input_global_scale")


@dataclass
class QuantWeight:
    """``weight[o, i] = (values[o, i] - zero[o, i // group]) * scale[o, i // group] + offset[o, i // group]``
    (no zero, no offset where None; ``offset``: GGUF's float minimums, ``engine/quant/gguf_blocks.py``)."""

    values: torch.Tensor  # int8 [out, in]: int8 values, or 4-bit ones in [-8, 7]
    scale: torch.Tensor  # float32 [out, groups]
    zero: torch.Tensor | None  # int8 [out, groups] (4-bit asymmetric), else None
    group_size: int  # columns per scale (``in`` for per-channel scales)
    offset: torch.Tensor | None = None  # float32 [out, groups], added after scaling

    def dequantize(self) -> torch.Tensor:
        q = self.values.float().unflatten(1, (-1, self.group_size))
        if self.zero is not None:
            q = q - self.zero.float().unsqueeze(-1)
        w = q * self.scale.unsqueeze(-1)
        if self.offset is not None:
            w = w + self.offset.unsqueeze(-1)
        return w.flatten(1)

    @staticmethod
    def cat(parts: list[QuantWeight]) -> QuantWeight:
        """Several checkpoint linears stacked along the output (q/k/v, gate/up) as one."""
        if len(parts) == 1:
            return parts[0]
        if len({p.group_size for p in parts}) != 1:
            raise ValueError("stacked quantized linears have different group sizes")
        if len({(p.zero is None, p.offset is None) for p in parts}) != 1:
            raise ValueError("stacked quantized linears differ in zero points or offsets")
        zero = None if parts[0].zero is None else torch.cat([p.zero for p in parts])
        offset = None if parts[0].offset is None else torch.cat([p.offset for p in parts])
        return QuantWeight(torch.cat([p.values for p in parts]), torch.cat([p.scale for p in parts]), zero,
                           parts[0].group_size, offset)


def decode(tensors: dict[str, torch.Tensor], scheme: QuantScheme, name: str) -> QuantWeight | Fp8Weight:
    """One linear's tensors (by suffix) -> a ``QuantWeight``, or for FP8 an ``Fp8Weight``."""
    scale = tensors["weight_scale"].float()
    if scheme.format == WeightFormat.FP8:
        values = tensors["weight"]
        if values.dtype != FP8:
            raise ValueError(f"{name}.weight is {values.dtype}, expected {FP8} in a float-quantized checkpoint")
        if scale.numel() not in (1, values.shape[0]):
            raise ValueError(f"{name}: {scale.numel()} weight scales for {values.shape[0]} output channels")
        return Fp8Weight(values, scale.reshape(-1, 1).expand(values.shape[0], 1).contiguous())
    if scheme.format == WeightFormat.INT8:
        values = tensors["weight"]
        if values.dtype != torch.int8:
            raise ValueError(f"{name}.weight is {values.dtype}, expected int8 in an int-quantized checkpoint")
        return QuantWeight(values, scale.reshape(values.shape[0], 1), None, values.shape[1])
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    shape = torch.Size(int(d) for d in tensors["weight_shape"].tolist())
    values = unpack_from_int32(tensors["weight_packed"], 4, shape).to(torch.int8)
    group = scheme.group_size or shape[1]
    if shape[1] % group or scale.shape != (shape[0], shape[1] // group):
        raise ValueError(f"{name}: scales {list(scale.shape)} do not fit {list(shape)} in groups of {group}")
    zero = None
    if not scheme.symmetric:
        zero = unpack_from_int32(tensors["weight_zero_point"], 4, torch.Size(scale.shape), packed_dim=0).to(torch.int8)
    return QuantWeight(values, scale, zero, group)
