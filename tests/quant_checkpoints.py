"""Quantized copies of an HF float checkpoint, written the way llm-compressor writes them.

``llmcompressor`` itself would downgrade this venv's transformers (5.23 -> 5.17), so the
checkpoints are made with the library it writes through, ``compressed-tensors``: its preset
scheme is applied to every Linear but ``lm_head`` (llm-compressor's usual ``ignore``), the weight
scales (and zero points) come from each channel's or group's min/max (``calculate_qparams``,
what llm-compressor's default min-max observer feeds it), and ``ModelCompressor`` compresses the
model and writes ``quantization_config`` into ``config.json``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

PRESETS = {"int8": "W8A8", "int4": "W4A16", "int4-asym": "W4A16_ASYM", "fp8": "FP8_DYNAMIC"}
COPIED = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
          "generation_config.json")


def _weight_qparams(module, args) -> None:
    from compressed_tensors.quantization.utils import calculate_qparams

    w = module.weight.detach().float()
    if args.strategy == "group":
        w = w.unflatten(-1, (-1, args.group_size))
        lo, hi = w.amin(-1), w.amax(-1)
    elif args.strategy == "channel":
        lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    else:
        lo, hi = w.amin(), w.amax()
    scale, zero = calculate_qparams(lo, hi, args)
    module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
    if getattr(module, "weight_zero_point", None) is not None:
        module.weight_zero_point.data.copy_(zero.reshape(module.weight_zero_point.shape))


def write_quantized(src: Path, out: Path, kind: str, group_size: int = 32) -> Path:
    """``src`` (an HF float folder) quantized as ``kind`` (int8, int4, int4-asym, fp8) into ``out``."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationStatus,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    scheme = preset_name_to_scheme(PRESETS[kind], ["Linear"])
    if scheme.weights.group_size:
        scheme.weights.group_size = group_size
    config = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"],
                                quantization_status=QuantizationStatus.INITIALIZED)
    apply_quantization_config(model, config, show_progress=False)
    for module in model.modules():
        if hasattr(module, "weight_scale"):
            _weight_qparams(module, module.quantization_scheme.weights)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(str(out))
    for name in COPIED:
        if (Path(src) / name).is_file():
            shutil.copy(Path(src) / name, out / name)
    return out


def weight_bytes(llm) -> int:
    """Resident bytes of a loaded model's weights and buffers, each storage counted once (tied
    tensors share one), CPU storages only."""
    model, seen, total = llm.engine.runner.model, set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        key = t.untyped_storage().data_ptr()
        if key not in seen and t.device.type == "cpu" and not t.is_meta:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def use_int4_reference(monkeypatch, weights: dict[str, torch.Tensor], vocab: int, rounds_to_bfloat16: bool) -> None:
    """Make every LLM built after this the int4 products' float reference: its linears get
    ``weights`` (the dequantised int4 weights ``dequantized_weight()`` gives) and repacked. Where
    the products are torch's int4 kernel (``rounds_to_bfloat16``: no C kernel), each linear but
    the LM head (``vocab`` outputs) rounds its input to bfloat16 and, at the few rows that kernel
    takes, its output too; the C kernel multiplies float32 rows as they are."""
    from engine import LLM
    from engine.models.linear import Linear
    from engine.quant.linear import Int4Linear

    plain, built = Linear.forward, LLM.__init__

    def with_int4_weights(self, *args, **kwargs):
        built(self, *args, **kwargs)
        model = self.engine.runner.model
        for name, weight in weights.items():
            module = model.get_submodule(name)
            module.weight.data.copy_(weight)
            module.pack()

    def rounded(self, x):
        if self.out_features == vocab:
            return plain(self, x)
        out = plain(self, x.bfloat16().float())
        return out.bfloat16().float() if x.shape[0] <= Int4Linear.KERNEL_MAX_ROWS else out

    monkeypatch.setattr(LLM, "__init__", with_int4_weights)
    if rounds_to_bfloat16:
        monkeypatch.setattr(Linear, "forward", rounded)
