"""Where a step's time goes: wall time per part of the engine on the summarisation workload.

Wraps the model's modules and the engine's phases with timers (no profiler overhead on
the ops themselves) and prints each part's share of the run.

    .venv/bin/python bench/profile_step.py --requests 32 --dtype float32
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import workload as workload_mod  # noqa: E402

import engine.llm_engine as llm_engine  # noqa: E402
from engine import LLM, SamplingParams  # noqa: E402
from engine.model_registry import DEFAULT_MODEL  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-batched-tokens", type=int, default=2048)
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from engine.model_registry import resolve_model

    wl = workload_mod.build(AutoTokenizer.from_pretrained(resolve_model(args.model)), args.requests)
    llm = LLM(args.model, dtype=args.dtype, max_num_batched_tokens=args.max_batched_tokens)
    llm.generate([p[:48 + 16 * i] for i, p in enumerate(wl.prompts[:12])],
                 [SamplingParams(max_tokens=2 + 3 * i, temperature=0) for i in range(12)])

    seconds: dict[str, float] = collections.defaultdict(float)

    def timed(name, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                seconds[name] += time.perf_counter() - t
        return wrapper

    engine = llm.engine
    runner, model, backend = engine.runner, engine.runner.model, engine.runner.backend
    runner.prepare = timed("build step tensors", runner.prepare)
    engine.scheduler.schedule = timed("schedule", engine.scheduler.schedule)
    llm_engine.sample = timed("sample", llm_engine.sample)
    model.forward = timed("model forward (all below)", model.forward)
    model.lm_head.forward = timed("  LM head", model.lm_head.forward)
    backend.write_kv = timed("  KV write", backend.write_kv)
    backend._decode = timed("  decode attention", backend._decode)
    backend._prefill_one = timed("  prefill attention", backend._prefill_one)
    model.rotary.rotate_ = timed("  rotary", model.rotary.rotate_)
    for layer in model.layers:
        layer.mlp.forward = timed("  MLP", layer.mlp.forward)
        layer.self_attn.qkv_proj.forward = timed("  QKV projection", layer.self_attn.qkv_proj.forward)
        layer.self_attn.o_proj.forward = timed("  output projection", layer.self_attn.o_proj.forward)
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.forward = timed("  RMSNorm (+ residual add)", norm.forward)

    params = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True) for m in wl.max_tokens]
    t = time.perf_counter()
    llm.generate(wl.prompts, params)
    wall = time.perf_counter() - t
    stats = llm.stats()
    print(f"{args.requests} requests, {args.dtype}: {wl.prompt_tokens} prompt + {wl.output_tokens} output tokens, "
          f"{stats['steps']} steps, {wall:.1f} s, {wl.output_tokens / wall:.1f} output tok/s")
    for name, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<28}{s:8.2f} s {100 * s / wall:6.1f}%")


if __name__ == "__main__":
    main()
