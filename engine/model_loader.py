"""Build an engine model from an HF-format directory (config.json + safetensors)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig

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
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for hf_name in sf.keys():
                name = hf_name.removeprefix("model.")
                if "rotary_emb" in name:
                    continue
                tensor = sf.get_tensor(hf_name)
                parts = name.split(".")
                fused = _FUSED.get(parts[-2]) if len(parts) >= 2 else None
                if fused is not None:
                    target, shard = fused
                    parts[-2] = target
                    pname = ".".join(parts)
                    offsets = [0]
                    for s in sizes[target]:
                        offsets.append(offsets[-1] + s)
                    with torch.no_grad():
                        params[pname].data[offsets[shard] : offsets[shard + 1]].copy_(tensor)
                    loaded.add(f"{pname}#{shard}")
                elif name in params:
                    with torch.no_grad():
                        params[name].data.copy_(tensor)
                    loaded.add(name)
                else:
                    raise ValueError(f"unexpected weight {hf_name} in {f.name}")
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
    missing = sorted(expected - loaded)
    if missing:
        raise ValueError(f"weights missing from {model_dir}: {', '.join(missing[:8])}")
    return model.to(device=device, dtype=dtype).eval()
