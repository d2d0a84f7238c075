"""An FP8 copy of a float HF checkpoint in compressed-tensors' ``float-quantized`` format, written
without compressed-tensors (the GPU machine has only torch, triton and transformers).

What llm-compressor's ``FP8_DYNAMIC`` scheme writes: every decoder Linear's weight as
``float8_e4m3fn`` with a float32 scale per output channel (``absmax / 448``,
``engine.quant.fp8_linear.quantize_fp8_channels``), dynamic per-token FP8 activations, the LM
head and embeddings left as they were (``ignore: ["lm_head"]``). The quantization runs on
``device`` (seconds for an 8B model on a GPU), one tensor at a time.

    PYTHONPATH=$PWD python bench/gpu/fp8_checkpoint.py SRC OUT [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine.quant.fp8_linear import quantize_fp8_channels

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
QUANTIZATION_CONFIG = {
    "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
    "ignore": ["lm_head"],
    "config_groups": {"group_0": {
        "targets": ["Linear"], "format": "float-quantized",
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                              "dynamic": True},
    }},
}


def quantized_name(name: str) -> bool:
    """A decoder layer's Linear weight (``model.layers.N.self_attn.q_proj.weight``, ...)."""
    parts = name.split(".")
    return name.endswith(".weight") and len(parts) >= 2 and parts[-2] in LINEARS and ".layers." in name


def write_fp8_checkpoint(src: Path, out: Path, device: str = "cpu") -> Path:
    """``src`` (config.json + safetensors) as an FP8 checkpoint in ``out`` (one safetensors file)."""
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(src.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as sf:
            for name in sf.keys():
                t = sf.get_tensor(name)
                if quantized_name(name):
                    fw = quantize_fp8_channels(t.to(device))
                    tensors[name] = fw.values.cpu()
                    tensors[name.removesuffix("weight") + "weight_scale"] = fw.scale.cpu()
                else:
                    tensors[name] = t
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"quantization_config": QUANTIZATION_CONFIG}, indent=1))
    for extra in ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (src / extra).is_file():
            shutil.copy(src / extra, out / extra)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    print(write_fp8_checkpoint(args.src, args.out, args.device))


if __name__ == "__main__":
    main()
