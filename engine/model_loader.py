"""Build an engine model from an HF-format directory (config.json + safetensors)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoTokenizer, GenerationConfig

from engine.config import QUANTIZATIONS
from engine.model_registry import GGUF_FILE
from engine.models.decoder import CausalLM
from engine.models.layers import RotaryEmbedding
from engine.models.linear import pack_linears
from engine.models.registry import model_class
from engine.quant.apply import QuantCollector, runs_as_stored, swap_linears
from engine.quant.gguf_apply import AS_STORED_DTYPES, gguf_linears, swap_gguf_linears
from engine.quant.scheme import checkpoint_scheme


def load_config(model_dir: Path):
    config = AutoConfig.from_pretrained(model_dir)
    checkpoint_scheme(config)  # before the tensors: a quantization it does not run is one line naming it
    model_class(config, model_dir)  # an unsupported architecture fails here, naming the supported ones
    return config


def _weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / n for n in names]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no .safetensors weights in {model_dir}")
    return files


_SHOWN = 10


def _mismatch_message(model_dir: Path, missing: list[str], unexpected: list[str], wrong_shape: list[str]) -> str:
    """One error naming every tensor that does not fit, so a partly loaded (partly random) model never runs."""
    lines = [f"checkpoint at {model_dir} does not match the model:"]
    for what, names in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong_shape)):
        if names:
            more = f", and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
            lines.append(f"  {what} tensors ({len(names)}): {', '.join(names[:_SHOWN])}{more}")
    return "\n".join(lines)


def load_model(model_dir: Path, dtype: torch.dtype, device: str, max_positions: int,
               quantization: str = "auto", shard: Callable[[CausalLM], CausalLM] | None = None) -> CausalLM:
    """The model with its weights; a quantized checkpoint (``engine/quant/scheme.py`` says which)
    runs quantized where its products run (``runs_as_stored``: int8/int4 on the CPU, FP8 on CUDA)
    unless ``quantization`` is ``"none"`` (dequantised to ``dtype``).
    ``shard``: cuts the loaded model to one tensor-parallel rank's part (``engine/parallel``),
    on the host, before it moves to ``device`` and its weights are packed."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {list(QUANTIZATIONS)}, got {quantization!r}")
    config = load_config(model_dir)
    scheme = checkpoint_scheme(config)
    cls = model_class(config, model_dir)
    files = _weight_files(model_dir)
    names = set()
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            names.update(sf.keys())
    with torch.device("meta"):
        model = cls(config, max_positions, **cls.options_from_checkpoint(config, names))
    model = model.to_empty(device="cpu")
    model.tie_weights()
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.build()  # its buffers were on meta
    params = dict(model.named_parameters())
    layout = model.checkpoint_layout()
    loaded: set[str] = set()
    unexpected: list[str] = []
    wrong_shape: list[str] = []
    collector = None if scheme is None else QuantCollector(scheme, names)
    found: dict = {}  # (parameter, first row) -> QuantWeight / Fp8Weight, for swap_linears

    def place(hf_name: str, tensor: torch.Tensor, where: str):
        key = hf_name if hf_name in layout else f"model.{hf_name}"  # a name without the prefix, as before
        entry = layout.get(key)
        if entry is None:
            unexpected.append(f"{hf_name} ({where})")
            return None
        pname, index = entry
        target = params[pname].data[index] if index else params[pname].data
        loaded.add(key)  # a misshapen tensor is reported as such rather than as missing
        if tuple(tensor.shape) != tuple(target.shape):  # copy_ would broadcast it silently
            wrong_shape.append(f"{hf_name} {list(tensor.shape)} (expected {list(target.shape)})")
            return None
        with torch.no_grad():
            target.copy_(tensor)
        first = index[0] if index else 0  # a slice of rows (a packed linear), or an expert's number (MoE)
        return pname, first if isinstance(first, int) else (first.start or 0)

    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for hf_name in sf.keys():
                if "rotary_emb" in hf_name:
                    continue
                if collector is not None and collector.take(hf_name, lambda n=hf_name: sf.get_tensor(n)):
                    continue
                place(hf_name, sf.get_tensor(hf_name), f.name)
    for hf_name, weight, qw in collector.weights() if collector is not None else ():
        spot = place(hf_name, weight, "dequantised")
        if spot is not None:
            found[spot] = qw
    missing = sorted(set(layout) - loaded)
    if missing or unexpected or wrong_shape:
        raise ValueError(_mismatch_message(model_dir, missing, unexpected, wrong_shape))
    gguf = model_dir / GGUF_FILE  # a model built from a GGUF: its blocks, kept beside the float weights
    gguf_found = None
    if gguf.is_file() and quantization == "auto" and device == "cpu" and dtype in AS_STORED_DTYPES and shard is None:
        gguf_found = gguf_linears(gguf, config, layout, params)
    kv_scales = collector.kv_cache_scales(config.num_hidden_layers) if collector is not None else None
    if shard is not None:
        model = shard(model)
    model = model.to(device=device, dtype=dtype).eval()
    model.quantization = f"GGUF dequantised to {dtype}" if gguf.is_file() else "none"
    if gguf_found is not None:
        model.quantization = swap_gguf_linears(model, *gguf_found)
    if scheme is not None:
        runs_quantized = quantization == "auto" and runs_as_stored(scheme, device) and swap_linears(model, scheme, found) > 0
        model.quantization = scheme.describe() if runs_quantized else f"{scheme.checkpoint_format} dequantised to {dtype}"
    model.kv_cache_scales = kv_scales  # per layer (key, value), for an FP8 KV pool (ModelRunner)
    if device == "cpu" and os.environ.get("TOKENMILL_PACK_WEIGHTS", "1") != "0":
        pack_linears(model)  # oneDNN layout, once (engine/models/linear.py)
    return model


def load_tokenizer(model_dir: Path):
    """The model's tokenizer, or None for a model folder without one (token-id prompts only)."""
    try:
        return AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError):
        return None


def eos_token_ids(model_dir: Path, tokenizer) -> set[int]:
    """Every end-of-sequence id the generation config or the tokenizer names."""
    ids: set[int] = set()
    try:
        gen = GenerationConfig.from_pretrained(model_dir)
        eos = gen.eos_token_id
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    except OSError:
        pass
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
