"""Where a step's time goes: wall time per part of the engine on the summarisation workload.

Wraps the model's modules and the engine's phases with timers (no profiler overhead on
the ops themselves) and prints each part's share of the run.

    .venv/bin/python bench/profile_step.py --requests 64 --dtype bfloat16 --out bench/published/profile.json

It also times every forward pass and groups them by size, since a batch job's time is spread
over the many thin steps of its long tail as much as over its few large ones.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sysinfo  # noqa: E402
import workload as workload_mod  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402
from engine.model_registry import DEFAULT_MODEL  # noqa: E402
from engine.scheduled_batch import is_decode  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-batched-tokens", type=int, default=2048)
    ap.add_argument("--out", help="also write the parts and the step-size table to this JSON file")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from engine.model_registry import resolve_model

    wl = workload_mod.build(AutoTokenizer.from_pretrained(resolve_model(args.model)), args.requests)
    llm = LLM(args.model, dtype=args.dtype, max_num_batched_tokens=args.max_batched_tokens)
    warm = wl.prompts[:12]  # fewer with --requests under 12
    llm.generate([p[:48 + 16 * i] for i, p in enumerate(warm)],
                 [SamplingParams(max_tokens=2 + 3 * i, temperature=0) for i in range(len(warm))])

    seconds, steps = instrument(llm)
    params = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True) for m in wl.max_tokens]
    t = time.perf_counter()
    llm.generate(wl.prompts, params)
    wall = time.perf_counter() - t
    stats = llm.stats()
    print(sysinfo.describe(sysinfo.cpu_info()))
    print(f"{args.requests} requests, {args.dtype}: {wl.prompt_tokens} prompt + {wl.output_tokens} output tokens, "
          f"{stats['steps']} steps, {wall:.1f} s, {wl.output_tokens / wall:.1f} output tok/s")
    parts = sorted(seconds.items(), key=lambda kv: -kv[1])
    for name, s in parts:
        print(f"  {name:<28}{s:8.2f} s {100 * s / wall:6.1f}%")
    table = step_table(steps)
    print("forward passes by size (decode rows; passes with prompt tokens apart):")
    for row in table:
        print(f"  {row['kind']:<8}{row['rows']:>10}  {row['passes']:4d} passes {row['seconds']:7.2f} s "
              f"{row['ms_per_pass']:7.1f} ms each  {row['prompt_tokens']:6d} prompt tokens")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "command": " ".join(sys.argv), "when_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            "machine": sysinfo.cpu_info(), "requests": args.requests, "dtype": args.dtype, "wall_s": wall,
            "output_tok_s": wl.output_tokens / wall, "steps": stats["steps"],
            "parts_s": {name.strip(): s for name, s in parts}, "passes_by_size": table}, indent=1))


def instrument(llm: LLM) -> tuple[dict[str, float], list[tuple[int, int, float]]]:
    """Wrap the engine's phases and the model's modules with wall-clock timers (for good: use a
    separate engine for clean timings). Returns the live ``seconds`` per part and the list each
    forward pass appends ``(decode rows, prompt tokens, seconds)`` to."""
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
    engine.sampler.sample = timed("sample", engine.sampler.sample)
    model.forward = timed("model forward (all below)", model.forward)
    model.lm_head.forward = timed("  LM head", model.lm_head.forward)
    backend.write_kv = timed("  KV write", backend.write_kv)
    backend._decode = timed("  decode attention", backend._decode)
    backend._prefill_one = timed("  prefill attention", backend._prefill_one)
    if getattr(backend, "prefill_kernel_fn", None) is not None:  # the C prefill kernel, where it runs
        backend.prefill_kernel_fn = timed("  prefill attention", backend.prefill_kernel_fn)
    for rotary in (getattr(model, "rotary", None), getattr(model, "rotary_local", None)):
        if rotary is not None:
            rotary.rotate_ = timed("  rotary", rotary.rotate_)
    for layer in model.layers:
        mlp = layer.mlp
        mlp.forward = timed("  MoE (router + experts)" if hasattr(mlp, "experts") else "  MLP", mlp.forward)
        layer.self_attn.qkv_proj.forward = timed("  QKV projection", layer.self_attn.qkv_proj.forward)
        layer.self_attn.o_proj.forward = timed("  output projection", layer.self_attn.o_proj.forward)
        for name, norm in layer.named_children():
            if name.endswith("layernorm"):
                norm.forward = timed("  RMSNorm (+ residual add)", norm.forward)

    steps: list[tuple[int, int, float]] = []  # (decode rows, prompt tokens, seconds) per forward pass
    execute = runner.execute

    def timed_execute(batch):
        t = time.perf_counter()
        try:
            return execute(batch)
        finally:
            decodes = sum(map(is_decode, batch.num_new_tokens, batch.num_computed_tokens))
            prompt = sum(batch.num_new_tokens) - decodes
            steps.append((decodes, prompt, time.perf_counter() - t))

    runner.execute = timed_execute
    return seconds, steps


def step_table(steps: list[tuple[int, int, float]]) -> list[dict]:
    """Forward passes grouped by decode rows (powers of two), those carrying prompt tokens apart."""
    groups: dict[tuple[str, int], list[float]] = collections.defaultdict(lambda: [0, 0.0, 0])
    for decodes, prompt, secs in steps:
        bucket = 1 << max(0, decodes - 1).bit_length() if decodes else 0
        g = groups[("prompt" if prompt else "decode", bucket)]
        g[0], g[1], g[2] = g[0] + 1, g[1] + secs, g[2] + prompt
    return [{"kind": kind, "rows": f"{bucket // 2 + 1 if bucket > 1 else bucket}-{bucket}", "passes": n,
             "seconds": s, "ms_per_pass": 1e3 * s / n, "prompt_tokens": p}
            for (kind, bucket), (n, s, p) in sorted(groups.items())]


if __name__ == "__main__":
    main()
