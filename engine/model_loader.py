"""Build an engine model from an HF-format directory (config.json + safetensors)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoTokenizer, GenerationConfig

from engine.models.linear import pack_linears
from engine.models.llama import LlamaForCausalLM, RotaryEmbedding

SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}
# HF weight name -> (our parameter name, index of the shard inside a fused parameter)
_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


def load_config(model_dir: Path):
    config = AutoConfig.from_pretrained(model_dir)
    archs = set(getattr(config, "architectures", None) or [])
    if not archs & SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"model at {model_dir} has architectures {sorted(archs)}; tokenmill runs "
            f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
        )
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


_UNFUSED = {(target, shard): hf for hf, (target, shard) in _FUSED.items()}
_SHOWN = 10


def _checkpoint_name(key: str) -> str:
    """Our parameter key (``layers.0.self_attn.qkv_proj.weight#1``) as the checkpoint names it."""
    name, _, shard = key.partition("#")
    if shard:
        parts = name.split(".")
        parts[-2] = _UNFUSED[(parts[-2], int(shard))]
        name = ".".join(parts)
    return name if name.startswith("lm_head.") else f"model.{name}"


def _mismatch_message(model_dir: Path, missing: list[str], unexpected: list[str], wrong_shape: list[str]) -> str:
    """One error naming every tensor that does not fit, so a partly loaded (partly random) model never runs."""
    lines = [f"checkpoint at {model_dir} does not match the model:"]
    for what, names in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong_shape)):
        if names:
            more = f", and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
            lines.append(f"  {what} tensors ({len(names)}): {', '.join(names[:_SHOWN])}{more}")
    return "\n".join(lines)


def load_model(model_dir: Path, dtype: torch.dtype, device: str, max_positions: int) -> LlamaForCausalLM:
    config = load_config(model_dir)
    files = _weight_files(model_dir)
    names = set()
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            names.update(sf.keys())
    qkv_bias = any(n.endswith("self_attn.q_proj.bias") for n in names)
    with torch.device("meta"):
        model = LlamaForCausalLM(config, max_positions, qkv_bias=qkv_bias)
    model = model.to_empty(device="cpu")
    model.rotary = RotaryEmbedding(config, model.head_dim, max_positions)  # its buffers were on meta
    params = dict(model.named_parameters())
    sizes = {
        "qkv_proj": [model.layers[0].self_attn.q_size, model.layers[0].self_attn.kv_size,
                     model.layers[0].self_attn.kv_size],
        "gate_up_proj": [config.intermediate_size, config.intermediate_size],
    }
    loaded: set[str] = set()
    unexpected: list[str] = []
    wrong_shape: list[str] = []
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for hf_name in sf.keys():
                name = hf_name.removeprefix("model.")
                if "rotary_emb" in name:
                    continue
                parts = name.split(".")
                fused = _FUSED.get(parts[-2]) if len(parts) >= 2 else None
                key, target = name, params.get(name)
                if fused is not None:
                    parts[-2] = fused[0]
                    pname = ".".join(parts)
                    key, target = f"{pname}#{fused[1]}", params.get(pname)
                    if target is not None:
                        offsets = [0]
                        for size in sizes[fused[0]]:
                            offsets.append(offsets[-1] + size)
                        target = target.data[offsets[fused[1]] : offsets[fused[1] + 1]]
                if target is None:
                    unexpected.append(f"{hf_name} ({f.name})")
                    continue
                tensor = sf.get_tensor(hf_name)
                if tuple(tensor.shape) != tuple(target.shape):  # copy_ would broadcast it silently
                    wrong_shape.append(f"{hf_name} {list(tensor.shape)} (expected {list(target.shape)})")
                    loaded.add(key)  # present, reported as misshapen rather than missing
                    continue
                with torch.no_grad():
                    target.data.copy_(tensor)
                loaded.add(key)
    tied = getattr(config, "tie_word_embeddings", False)
    if tied:
        model.lm_head.weight = model.embed_tokens.weight
    expected = set()
    for pname in dict(model.named_parameters(remove_duplicate=False)):
        if tied and pname == "lm_head.weight":
            continue
        if pname.endswith(("qkv_proj.weight", "qkv_proj.bias")):
            expected.update(f"{pname}#{i}" for i in range(3))
        elif pname.endswith("gate_up_proj.weight"):
            expected.update(f"{pname}#{i}" for i in range(2))
        else:
            expected.add(pname)
    missing = sorted(_checkpoint_name(k) for k in expected - loaded)
    if missing or unexpected or wrong_shape:
        raise ValueError(_mismatch_message(model_dir, missing, unexpected, wrong_shape))
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
