"""Build an engine model from an HF-format directory (config.json + safetensors)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoTokenizer, GenerationConfig

from engine.models.decoder import CausalLM
from engine.models.layers import RotaryEmbedding
from engine.models.linear import pack_linears
from engine.models.registry import model_class


def load_config(model_dir: Path):
    config = AutoConfig.from_pretrained(model_dir)
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
               shard: Callable[[CausalLM], CausalLM] | None = None) -> CausalLM:
    """``shard``: cuts the loaded model to one tensor-parallel rank's part (``engine/parallel``),
    on the host, before it moves to ``device`` and its weights are packed."""
    config = load_config(model_dir)
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
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for hf_name in sf.keys():
                if "rotary_emb" in hf_name:
                    continue
                key = hf_name if hf_name in layout else f"model.{hf_name}"  # a name without the prefix, as before
                entry = layout.get(key)
                if entry is None:
                    unexpected.append(f"{hf_name} ({f.name})")
                    continue
                pname, index = entry
                target = params[pname].data[index] if index else params[pname].data
                tensor = sf.get_tensor(hf_name)
                loaded.add(key)  # a misshapen tensor is reported as such rather than as missing
                if tuple(tensor.shape) != tuple(target.shape):  # copy_ would broadcast it silently
                    wrong_shape.append(f"{hf_name} {list(tensor.shape)} (expected {list(target.shape)})")
                    continue
                with torch.no_grad():
                    target.copy_(tensor)
    missing = sorted(set(layout) - loaded)
    if missing or unexpected or wrong_shape:
        raise ValueError(_mismatch_message(model_dir, missing, unexpected, wrong_shape))
    if shard is not None:
        model = shard(model)
    model = model.to(device=device, dtype=dtype).eval()
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
