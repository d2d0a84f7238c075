"""Helpers shared by the GPU scripts: random-weight models, prompts, the HF greedy reference."""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# Llama-3.2-1B's shape (the weights are random: the shape decides the speed, not the values).
LLAMA_1B = dict(
    hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
    num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=131072,
    rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    tie_word_embeddings=True, rms_norm_eps=1e-5, bos_token_id=128000, eos_token_id=128001,
)
# Llama-3.1-8B's shape: 32 layers of 4,096, 32 query heads over 8 KV heads of 128, untied head.
LLAMA_8B = dict(LLAMA_1B, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, head_dim=128,
                tie_word_embeddings=False)
# Large init so greedy argmax has no near-ties (as tests/model_fixtures.py's tiny Llama).
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=49152, max_position_embeddings=1024, initializer_range=0.2)
# Llama-1B's attention shape (32/8 heads of 64) on 4 narrow layers.
MID = dict(hidden_size=2048, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=32,
           num_key_value_heads=8, head_dim=64, vocab_size=32000, max_position_embeddings=4096,
           initializer_range=0.05)


def free() -> None:
    """Give the memory of models and engines just dropped back to the device."""
    gc.collect()
    torch.cuda.empty_cache()


def build_model(out: Path, device: str, seed: int = 0, dtype: torch.dtype = torch.float32, **params) -> Path:
    """A random-weight Llama saved as safetensors (built on ``device``: a 1B model in seconds)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    base = dict(tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-5)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**(base | params))).to(dtype)
    model.save_pretrained(out)
    del model
    return out


def random_prompts(n: int, seed: int, vocab: int, shared: int = 20, lengths=(1, 5, 15, 16, 17, 33, 47, 64, 80, 100, 120)):
    """As tests/engine_cases.py: mixed lengths, most start with a shared prefix."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, vocab) for _ in range(shared)]
    out = []
    for i in range(n):
        body = [rng.randrange(3, vocab) for _ in range(lengths[i % len(lengths)])]
        out.append(body if i % 4 == 3 else prefix + body)
    return out


def hf_greedy(model_dir: Path, prompts, new_tokens: int, dtype: torch.dtype, device: str):
    """HF's greedy tokens one prompt at a time (no padding), and the top-2 logit gap at each step."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    tokens, gaps = [], []
    with torch.inference_mode():
        for p in prompts:
            gen = model.generate(
                torch.tensor([p], device=device), attention_mask=torch.ones(1, len(p), dtype=torch.long, device=device),
                max_new_tokens=new_tokens, do_sample=False, pad_token_id=2,
                output_logits=True, return_dict_in_generate=True,
            )
            tokens.append(gen.sequences[0, len(p):].tolist())
            top2 = [step[0].float().topk(2).values for step in gen.logits]
            gaps.append([float(t[0] - t[1]) for t in top2])
    del model
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return tokens, gaps


def compare(got: list[list[int]], ref: list[list[int]], gaps: list[list[float]]) -> dict[str, Any]:
    """Identical prompts, and for each differing one the step and HF's top-2 gap there."""
    diffs = []
    for i, (a, b) in enumerate(zip(got, ref, strict=True)):
        first = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        if first is None and len(a) != len(b):
            first = min(len(a), len(b))
        if first is not None:
            diffs.append({"prompt": i, "step": first, "hf_top2_gap": gaps[i][first] if first < len(gaps[i]) else None})
    return {"prompts": len(ref), "identical": len(ref) - len(diffs), "diffs": diffs}


class Recorder:
    """Runs named sections, keeps going past a failure, and writes everything as JSON after each."""

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {"meta": meta, "sections": {}}

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        print(f"\n=== {name}", flush=True)
        start = time.perf_counter()
        try:
            result = fn()
            entry = {"ok": True, "result": result}
        except Exception as exc:  # noqa: BLE001 - a device run must report every section
            traceback.print_exc()
            result = None
            entry = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
        entry["seconds"] = round(time.perf_counter() - start, 2)
        self.data["sections"][name] = entry
        self.path.write_text(json.dumps(self.data, indent=1, default=str))
        print(f"=== {name}: {'ok' if entry['ok'] else 'FAILED ' + entry['error']} ({entry['seconds']} s)", flush=True)
        return result


def device_meta() -> dict[str, Any]:
    import platform

    import transformers
    import triton

    meta = {"torch": torch.__version__, "triton": triton.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        meta |= {"gpu": p.name, "gpu_memory_gib": round(p.total_memory / 2**30, 1), "sms": p.multi_processor_count,
                 "cuda": torch.version.cuda}
    return meta


def bench_ms(fn: Callable[[], Any]) -> float:
    """Median milliseconds of ``fn`` (triton's do_bench on a GPU; one timed call elsewhere)."""
    if not torch.cuda.is_available():
        t = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - t)
    from triton.testing import do_bench

    return do_bench(fn, warmup=10, rep=40, return_mode="median")


def tune_arguments() -> argparse.Namespace:
    """The kernel-tuning scripts' command line: where the results and the chosen launch go, the job."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--launch-out", type=Path)
    ap.add_argument("--workload", type=Path, default=Path(__file__).with_name("summ-1024.json"))
    ap.add_argument("--small", action="store_true", help="tiny shapes and grid (try the script on a CPU)")
    return ap.parse_args()
