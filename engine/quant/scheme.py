"""The one place that decides which quantized checkpoints tokenmill loads.

``checkpoint_scheme(config)`` reads a model config's ``quantization_config`` and returns a
``QuantScheme`` for what runs, None for a float checkpoint, or raises one line naming the method
and format it does not load. Supported, as ``llm-compressor`` writes them (``compressed-tensors``):

- ``int-quantized`` (or ``naive-quantized``) int8 weights, per-channel symmetric scales, with
  dynamic per-token symmetric int8 activations (W8A8): runs as int8 x int8 products;
- ``pack-quantized`` 4-bit weights in int32 words, group-wise scales, with or without zero points,
  no activation quantization (W4A16): runs as int4 weight-only products;
- ``float-quantized`` FP8 (E4M3) weights, per-channel or per-tensor scales, any FP8 activation
  scheme (W8A8-FP8): on CUDA (compute capability 8.9+) FP8 x FP8 products with per-channel weight
  and dynamic per-token activation scales (``fp8_linear.py``); on the CPU the weights are
  dequantised once to the model's dtype, so it runs as a float model.

A ``kv_cache_scheme`` of static per-tensor FP8 (``k_scale``/``v_scale`` per attention layer, as
llm-compressor calibrates them) is taken beside any of these: the scales are what an FP8 KV pool
(``kv_cache_dtype="fp8"``) divides by; with another pool they are not used. Other KV schemes
(per-head, dynamic, integer) are refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from engine.model_errors import UnsupportedQuantization

QUANT_METHOD = "compressed-tensors"
SUPPORTED = "compressed-tensors int8 W8A8 (int-quantized), 4-bit W4A16 (pack-quantized), FP8 (float-quantized)"


class WeightFormat(StrEnum):
    INT8 = "int8"  # W8A8: int8 weights per channel, int8 activations per token
    INT4 = "int4"  # W4A16: 4-bit weights per group
    FP8 = "fp8"  # W8A8-FP8 on CUDA; dequantised to float on the CPU


@dataclass(frozen=True)
class QuantScheme:
    format: WeightFormat
    checkpoint_format: str  # compressed-tensors' name: int-quantized, pack-quantized, float-quantized
    group_size: int | None  # INT4: columns per scale
    symmetric: bool
    targets: tuple[str, ...]
    ignore: tuple[str, ...]  # module names or ``re:`` patterns left in float
    kv_scales: bool = False  # the checkpoint has static per-tensor FP8 k_scale/v_scale per attention layer

    def describe(self) -> str:
        runs = {WeightFormat.INT8: "int8 W8A8 (int8 x int8 products, per-token activation scales)",
                WeightFormat.INT4: f"int4 W4A16 (group {self.group_size}, "
                                   f"{'symmetric' if self.symmetric else 'with zero points'})",
                WeightFormat.FP8: "FP8 W8A8 (torch._scaled_mm, per-channel weight and per-token activation scales)"}
        return runs[self.format]


def _refuse(what: str) -> UnsupportedQuantization:
    return UnsupportedQuantization(f"unsupported quantization: {what}; tokenmill loads {SUPPORTED}")


def _get(obj, key: str, default=None):
    return obj.get(key, default) if isinstance(obj, dict) else getattr(obj, key, default)


def _quant_dict(config) -> dict | None:
    qc = _get(config, "quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        qc = qc.to_dict() if hasattr(qc, "to_dict") else dict(vars(qc))
    return qc


def checkpoint_scheme(config) -> QuantScheme | None:
    """What runs for this config's ``quantization_config`` (None: not quantized); anything else
    is one ``ValueError`` line naming the method (and format or scheme) that is not loaded."""
    qc = _quant_dict(config)
    if qc is None:
        return None
    method = qc.get("quant_method", "unknown")
    if method != QUANT_METHOD:
        raise _refuse(f"quant_method {method!r}")
    groups = list((qc.get("config_groups") or {}).values())
    if not groups:
        raise _refuse("compressed-tensors checkpoint without config_groups")
    kv = qc.get("kv_cache_scheme") or {}
    if kv and not (kv.get("type") == "float" and kv.get("num_bits") == 8 and kv.get("strategy") == "tensor"
                   and not kv.get("dynamic")):
        raise _refuse(f"compressed-tensors kv_cache_scheme {kv.get('type')}{kv.get('num_bits')} {kv.get('strategy')}"
                      f"{' dynamic' if kv.get('dynamic') else ''} (only static per-tensor FP8 KV scales)")
    if any(g != groups[0] for g in groups[1:]):
        raise _refuse("compressed-tensors checkpoint with several different config_groups")
    group = groups[0]
    fmt = group.get("format") or qc.get("format") or "unknown"
    w, act = group.get("weights") or {}, group.get("input_activations")
    targets = tuple(group.get("targets") or ())
    if targets != ("Linear",):
        raise _refuse(f"compressed-tensors targets {list(targets)} (only ['Linear'])")
    if group.get("output_activations"):
        raise _refuse("compressed-tensors output_activations")
    if w.get("actorder") in ("group", "dynamic"):  # "weight"/"static" leave the plain layout
        raise _refuse(f"compressed-tensors actorder {w['actorder']!r} (weight_g_idx column groups)")
    bits, wtype, strategy = w.get("num_bits"), w.get("type"), w.get("strategy")
    sym, ignore = bool(w.get("symmetric", True)), tuple(qc.get("ignore") or ())
    if fmt == "float-quantized" and wtype == "float" and bits == 8 and strategy in ("channel", "tensor"):
        if act is not None and (act.get("type") != "float" or act.get("num_bits") != 8):
            raise _refuse(f"float-quantized weights with {act.get('type')}{act.get('num_bits')} activations")
        return QuantScheme(WeightFormat.FP8, fmt, None, sym, targets, ignore, bool(kv))
    if fmt in ("int-quantized", "naive-quantized") and wtype == "int" and bits == 8 and strategy == "channel" and sym:
        ok_act = act is not None and act.get("type") == "int" and act.get("num_bits") == 8 and \
            act.get("strategy") == "token" and act.get("dynamic") is True and act.get("symmetric", True)
        if not ok_act:
            raise _refuse(f"{fmt} int8 weights without dynamic per-token int8 activations ({act})")
        return QuantScheme(WeightFormat.INT8, fmt, None, True, targets, ignore, bool(kv))
    if fmt == "pack-quantized" and wtype == "int" and bits == 4 and strategy == "group" and act is None:
        return QuantScheme(WeightFormat.INT4, fmt, int(w["group_size"]), sym, targets, ignore, bool(kv))
    scheme = f"{wtype}{bits} {strategy} weights" + (f", {act.get('type')}{act.get('num_bits')} activations" if act else "")
    raise _refuse(f"compressed-tensors format {fmt!r} with {scheme}")
