"""A quantized checkpoint through the loader: its quantized linears' tensors collected while the
loader reads the files, decoded, and the model's Linears swapped for the quantized products where
they run (``runs_as_stored``): int8 and int4 on the CPU (``linear.py``), FP8 on CUDA GPUs of
compute capability 8.9 or later (``fp8_linear.py``).

The loader first fills every float parameter with the dequantised weight (``QuantWeight.dequantize``),
so the name checks stay the loader's and ``quantization = "none"`` is that model as it stands;
``swap_linears`` then replaces each Linear whose every shard (q/k/v, gate/up) is quantized, and the
float weight is dropped with the module.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import torch
from torch import nn

from engine.quant.checkpoint import QUANT_SUFFIXES, QuantWeight, decode
from engine.quant.fp8_linear import Fp8Linear, Fp8Weight
from engine.quant.linear import Int4Linear, Int8Linear
from engine.quant.scheme import QuantScheme, WeightFormat

KV_SCALES = ("k_scale", "v_scale")  # llm-compressor's names, on each layer's self_attn


class QuantCollector:
    """Gathers each quantized linear's tensors as the loader walks the checkpoint."""

    def __init__(self, scheme: QuantScheme, names: set[str]) -> None:
        self.scheme = scheme
        self.quantized = {n.rpartition(".")[0] for n in names if n.endswith(".weight_scale")}
        self.parts: dict[str, dict[str, torch.Tensor]] = {}
        self.kv: dict[str, float] = {}  # "...layers.N.self_attn.k_scale" -> its value

    def take(self, hf_name: str, get: Callable[[], torch.Tensor]) -> bool:
        """Keep ``hf_name`` if it belongs to a quantized linear or is a KV scale (True), else
        leave it to the loader."""
        prefix, _, suffix = hf_name.rpartition(".")
        if self.scheme.kv_scales and suffix in KV_SCALES:
            value = get()
            if value.numel() != 1:
                raise ValueError(f"{hf_name} has {value.numel()} values; only per-tensor KV scales are loaded")
            self.kv[hf_name] = float(value.float().reshape(()))
            return True
        if prefix not in self.quantized or (suffix != "weight" and suffix not in QUANT_SUFFIXES):
            return False
        self.parts.setdefault(prefix, {})[suffix] = get()
        return True

    def kv_cache_scales(self, num_layers: int) -> list[tuple[float, float]] | None:
        """Each decoder layer's (key, value) scale from a ``kv_cache_scheme`` checkpoint, in layer
        order (None without one); a layer without both is one error naming what is missing."""
        if not self.scheme.kv_scales:
            return None
        found: dict[tuple[int, str], float] = {}
        for name, value in self.kv.items():
            layer = re.search(r"(?:^|\.)layers\.(\d+)\.", name)
            if layer is not None:
                found[(int(layer.group(1)), name.rpartition(".")[2])] = value
        missing = [f"layer {i} {s}" for i in range(num_layers) for s in KV_SCALES if (i, s) not in found]
        if missing:
            raise ValueError(f"kv_cache_scheme checkpoint without {', '.join(missing[:4])}"
                             + (f" and {len(missing) - 4} more" if len(missing) > 4 else ""))
        return [(found[(i, "k_scale")], found[(i, "v_scale")]) for i in range(num_layers)]

    def weights(self) -> Iterator[tuple[str, torch.Tensor, QuantWeight | Fp8Weight]]:
        """``(HF weight name, float32 weight, decoded weight)`` per quantized linear."""
        for prefix, tensors in self.parts.items():
            decoded = decode(tensors, self.scheme, prefix)
            yield f"{prefix}.weight", decoded.dequantize(), decoded


def runs_as_stored(scheme: QuantScheme, device: str) -> bool:
    """Whether ``device`` has this format's products: int8/int4 are CPU kernels; FP8 needs
    ``torch._scaled_mm`` on a CUDA GPU of compute capability 8.9+ (Ada, Hopper, Blackwell). FP8 on the
    CPU stays dequantised: torch's CPU ``_scaled_mm`` exists, but is the tests' reference, not a fast path."""
    dev = torch.device(device)
    if scheme.format == WeightFormat.FP8:
        return dev.type == "cuda" and torch.cuda.get_device_capability(dev) >= (8, 9)
    return dev.type == "cpu"


def swap_linears(model: nn.Module, scheme: QuantScheme, found: dict[tuple[str, int], QuantWeight | Fp8Weight]) -> int:
    """Replace each Linear whose weight rows are all covered by ``found`` ((parameter name, first
    row) -> decoded weight) with the quantized product, on the Linear's device; returns how many
    were replaced."""
    cls = {WeightFormat.INT8: Int8Linear, WeightFormat.INT4: Int4Linear, WeightFormat.FP8: Fp8Linear}[scheme.format]
    by_param: dict[str, list[tuple[int, QuantWeight | Fp8Weight]]] = {}
    for (pname, start), qw in found.items():
        by_param.setdefault(pname, []).append((start, qw))
    swapped = 0
    for pname, parts in by_param.items():
        mname = pname.rpartition(".")[0]
        module = model.get_submodule(mname)
        parts.sort(key=lambda p: p[0])
        rows = sum(qw.values.shape[0] for _, qw in parts)
        if rows != module.weight.shape[0] or module.weight.shape[1] != parts[0][1].values.shape[1]:
            continue  # partly quantized (or a tied weight): stays float
        try:
            quantized = cls(type(parts[0][1]).cat([qw for _, qw in parts]), module.bias).to(module.weight.device)
        except ValueError:  # a shape the product does not take (Int4Linear: rows in blocks of 64): stays float
            continue
        parent, _, child = mname.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, quantized)
        swapped += 1
    return swapped
