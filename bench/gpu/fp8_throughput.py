"""FP8 against bfloat16 on one GPU (issue 44): the 1,024-request summarisation job on random-weight
models of Llama-3.2-1B's and Llama-3.1-8B's shapes, each run three ways with the same LLM(...) call:

- ``bf16``: the bfloat16 checkpoint;
- ``fp8``: its FP8 copy (``fp8_checkpoint.py``: per-channel E4M3 weights, compressed-tensors
  format), which loads as ``Fp8Linear`` (``torch._scaled_mm``) on CUDA;
- ``fp8-kv``: the FP8 copy with ``kv_cache_dtype="fp8"`` (the pool holds twice the blocks).

Each config: start-up, a short warm-up, then ``--passes`` timed passes (2; the 8B shape
``--passes-8b``, 1), the last reported. Each prints output tokens/s, the ratio to ``bf16``, the
KV pool's blocks and bytes, and the decode graph's device time per step; everything lands in
``--out`` (JSON) after each section. First, on a small model of the 1B's attention shape
(``MID``), ``graphs-vs-eager`` counts the prompts whose greedy tokens with FP8 weights and FP8 KV
are the same with CUDA graphs as eager (and as with a bfloat16 pool).

    PYTHONPATH=$PWD python bench/gpu/fp8_throughput.py --out $OUT/fp8-throughput.json
    PYTHONPATH=$PWD python bench/gpu/fp8_throughput.py --out /tmp/fp8.json --smoke   # CPU dry run

``--smoke``: the tiny shape on the CPU, 16 requests of at most 8 tokens, torch attention (the
Triton kernels on CPU tensors need the interpreter), the FP8 copy run as ``Fp8Linear`` through
torch's CPU ``_scaled_mm``: the script's own path, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import LLAMA_1B, LLAMA_8B, MID, TINY, Recorder, build_model, device_meta, free  # noqa: E402
from fp8_checkpoint import write_fp8_checkpoint  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402

SHAPES = {"1b": LLAMA_1B, "8b": LLAMA_8B, "mid": MID, "tiny": TINY}
CONFIGS = ("bf16", "fp8", "fp8-kv")


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run(model_dir: Path, settings: dict, prompts, budgets, passes: int, device: str) -> dict:
    """Start-up, a short warm-up, then ``passes`` timed passes of the job (each shifts the token ids,
    so no pass hits another's prefix cache); the last is reported, all are listed."""
    t0 = time.perf_counter()
    llm = LLM(str(model_dir), **settings)
    startup = time.perf_counter() - t0
    runner = llm.engine.runner
    vocab = runner.model.config.vocab_size
    llm.generate([[5 + i] * (40 + 50 * i) for i in range(8)], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    params = [SamplingParams(max_tokens=b, temperature=0, ignore_eos=True) for b in budgets]
    walls = []
    for shift in range(0, 2 * passes, 2):
        batch = [[(t + shift) % vocab for t in p] for p in prompts]
        sync(device)
        t0 = time.perf_counter()
        outs = llm.generate(batch, params)
        sync(device)
        walls.append(time.perf_counter() - t0)
    out_tokens = sum(len(o.token_ids) for o in outs)
    pool = runner.kv_pool
    res = {"settings": settings, "quantization": llm.engine.quantization, "startup_s": startup,
           "timed_passes_wall_s": walls, "wall_s": walls[-1], "output_tokens": out_tokens,
           "expected_output_tokens": sum(budgets), "output_tok_per_s": out_tokens / walls[-1],
           "errors": sum(o.error is not None for o in outs), "kv_pool_blocks": llm.engine.num_kv_blocks,
           "kv_pool_dtype": str(pool.dtype), "kv_pool_gib": pool.nbytes / 2**30, "stats": llm.stats()}
    if device == "cuda":
        from gpu_throughput import decode_step_times

        free_b, total_b = torch.cuda.mem_get_info()
        res["gpu_used_gib"] = (total_b - free_b) / 2**30
        if runner.decode_graphs is not None:
            res["decode_step_device_ms"] = decode_step_times(llm, runner.decode_graphs)
    print(f"  {llm.engine.quantization[:40]:40s} kv {res['kv_pool_dtype']:20s} {res['kv_pool_blocks']:9d} blocks: "
          f"{out_tokens} tok in {walls[-1]:.2f}s = {res['output_tok_per_s']:.0f} tok/s (startup {startup:.1f}s)",
          flush=True)
    del llm, outs, runner, pool
    free() if device == "cuda" else None
    return res


def graphs_vs_eager(folder: Path, device: str, smoke: bool) -> dict:
    """Greedy tokens of the FP8 copy (FP8 KV) with CUDA graphs against the same engine eager, and
    against the bfloat16 pool with graphs: the graph paths must not change what FP8 computes.
    Counts only; the throughput sections are read knowing whether these agree."""
    from common import random_prompts

    prompts = random_prompts(16, seed=3, vocab=MID["vocab_size"])
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    common = dict(dtype="bfloat16", device=device, max_model_len=512, max_num_seqs=16, num_kv_blocks=256)
    common |= dict(attention_backend="torch") if smoke else dict(attention_backend="triton")
    runs = {}
    for name, extra in (("fp8-kv-graphs", dict(kv_cache_dtype="fp8")), ("fp8-kv-eager", dict(kv_cache_dtype="fp8",
                        enforce_eager=True)), ("bf16-kv-graphs", {})):
        llm = LLM(str(folder), **common, **extra)
        runs[name] = [o.token_ids for o in llm.generate(prompts, params)]
        runs[name + "-quantization"] = llm.engine.quantization
        del llm
        free() if device == "cuda" else None
    same = lambda a, b: sum(x == y for x, y in zip(runs[a], runs[b], strict=True))  # noqa: E731
    res = {"prompts": len(prompts), "graphs_vs_eager_identical": same("fp8-kv-graphs", "fp8-kv-eager"),
           "fp8_vs_bf16_kv_identical": same("fp8-kv-graphs", "bf16-kv-graphs"),
           "quantization": runs["fp8-kv-graphs-quantization"]}
    print(f"  {res}", flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", nargs="+", default=["1b", "8b"], choices=sorted(SHAPES))
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--passes", type=int, default=2, help="timed passes per config (after a short warm-up)")
    ap.add_argument("--passes-8b", type=int, default=1, help="the same for the 8B shape (its passes are longer)")
    ap.add_argument("--workload", type=Path, default=Path(__file__).with_name("summ-1024.json"))
    ap.add_argument("--smoke", action="store_true", help="tiny shape on the CPU: the script's path, no measurement")
    args = ap.parse_args()
    device = "cpu" if args.smoke else "cuda"
    if args.smoke:  # run the FP8 copy as Fp8Linear on the CPU too (torch's CPU _scaled_mm), as CUDA would
        import engine.model_loader

        engine.model_loader.runs_as_stored = lambda scheme, dev: True
    shapes = ["tiny"] if args.smoke else args.shapes
    rec = Recorder(args.out, device_meta() | {"script": "bench/gpu/fp8_throughput.py", "argv": sys.argv[1:]})
    wl = json.loads(args.workload.read_text())
    n = 16 if args.smoke else args.requests
    prompts, budgets = wl["prompts"][:n], wl["max_tokens"][:n]
    if args.smoke:
        prompts, budgets = [p[:48] for p in prompts], [min(b, 8) for b in budgets]
    base = dict(dtype="bfloat16", max_model_len=4096, device=device)
    base |= dict(attention_backend="torch", kv_cache_memory_gb=0.05) if args.smoke else \
        dict(attention_backend="triton", enforce_eager=False)
    tmp = Path(tempfile.mkdtemp())
    small = "tiny" if args.smoke else "mid"  # mid: Llama-1B's attention shape on 4 narrow layers
    check = rec.run(f"build-{small}-check", lambda: build_model(tmp / f"{small}-check", device, dtype=torch.bfloat16,
                                                               **SHAPES[small]))
    if check is not None:
        check_fp8 = rec.run(f"fp8-checkpoint-{small}-check",
                            lambda: write_fp8_checkpoint(check, tmp / f"{small}-check-fp8", device))
        if check_fp8 is not None:
            rec.run(f"{small}/graphs-vs-eager", lambda: graphs_vs_eager(check_fp8, device, args.smoke))
    for shape in shapes:
        dirs = {"bf16": rec.run(f"build-{shape}", lambda s=shape: build_model(tmp / s, device, dtype=torch.bfloat16,
                                                                              **SHAPES[s]))}
        if dirs["bf16"] is None:
            continue
        dirs["fp8"] = rec.run(f"fp8-checkpoint-{shape}", lambda s=shape, src=dirs["bf16"]: write_fp8_checkpoint(
            src, tmp / f"{s}-fp8", device))
        for config in args.configs:
            folder = dirs["bf16" if config == "bf16" else "fp8"]
            settings = base | ({"kv_cache_dtype": "fp8"} if config == "fp8-kv" else {})
            passes = args.passes_8b if shape == "8b" else args.passes
            if folder is not None:
                rec.run(f"{shape}/{config}", lambda f=folder, s=settings, p=passes: run(f, s, prompts, budgets, p, device))
    summary(rec)


def summary(rec: Recorder) -> None:
    print("\nSUMMARY fp8_throughput")
    sections = rec.data["sections"]
    for name, e in sections.items():
        r = e.get("result") if e["ok"] else None
        if not (isinstance(r, dict) and "output_tok_per_s" in r):
            print(f"  {name:20s} {'ok' if e['ok'] else 'FAILED ' + e.get('error', '')[:150]} ({e['seconds']}s)")
            continue
        base = sections.get(name.rsplit("/", 1)[0] + "/bf16", {}).get("result") or {}
        ratio = r["output_tok_per_s"] / base["output_tok_per_s"] if base.get("output_tok_per_s") else float("nan")
        blocks = r["kv_pool_blocks"] / base["kv_pool_blocks"] if base.get("kv_pool_blocks") else float("nan")
        print(f"  {name:20s} {r['output_tok_per_s']:9.0f} out tok/s  x{ratio:.2f} of bf16  wall {r['wall_s']:7.2f}s  "
              f"KV {r['kv_pool_blocks']} blocks (x{blocks:.2f}) {r['kv_pool_gib']:.1f} GiB {r['kv_pool_dtype']}")


if __name__ == "__main__":
    main()
