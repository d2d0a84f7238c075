"""Side-by-side engine benchmark on the summarisation workload (see bench/workload.py).

Runs, in one process and one sitting: tokenmill in its configurations (continuous vs
static scheduling, paged vs contiguous KV, float32 and bfloat16), HF transformers
``generate`` with static batches as the baseline, and vLLM's CPU backend if it is
installed. Prints one table, writes JSON and a PNG.

    .venv/bin/python bench/bench_engine.py --requests 64 --dtypes float32 bfloat16 --hf
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import workload as workload_mod  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402

CONFIGS = {
    "continuous+paged": dict(),
    "continuous+paged, no prefix cache": dict(enable_prefix_caching=False),
    "static+paged": dict(scheduling="static", max_num_seqs=16),
    "continuous+contiguous": dict(kv_allocation="contiguous"),
}


def model_flops(stats: dict, model) -> float:
    """FLOPs the engine really computed: every fed token through the layers, the LM head
    only for sampled tokens (attention's share is small at these lengths and left out)."""
    embed = model.embed_tokens.weight.numel()
    body = sum(p.numel() for p in model.parameters()) - embed
    fed = stats["prompt_tokens_computed"] + stats["decode_tokens"]
    return 2.0 * body * fed + 2.0 * embed * stats["decode_tokens"]


def matmul_ceiling(dtype: torch.dtype, repeats: int = 20) -> float:
    """GFLOP/s of a plain matmul with the model's MLP shape, measured now, in this process."""
    a = torch.randn(256, 576, dtype=dtype)
    b = torch.randn(576, 1536, dtype=dtype)
    for _ in range(3):
        a @ b
    t = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * 256 * 576 * 1536 * repeats / (time.perf_counter() - t) / 1e9


def run_tokenmill(name: str, settings: dict, dtype: str, wl, args) -> dict:
    llm = LLM(args.model, dtype=dtype, max_num_batched_tokens=args.max_batched_tokens,
              max_num_seqs=settings.pop("max_num_seqs", args.max_num_seqs), **settings)
    # Warm-up: compiles the decode attention for a spread of batch sizes before timing.
    llm.generate([p[:48 + 16 * i] for i, p in enumerate(wl.prompts[:12])],
                 [SamplingParams(max_tokens=2 + 3 * i, temperature=0) for i in range(12)])
    llm.engine.stats_tracker.__init__(llm.engine.num_kv_blocks, llm.engine.config.block_size)
    llm.engine.scheduler.prefix_query_tokens = llm.engine.scheduler.prefix_hit_tokens = 0
    llm.engine.scheduler.num_preemptions = 0
    llm.engine.block_manager.reset_prefix_cache()
    params = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True) for m in wl.max_tokens]
    t = time.perf_counter()
    outs = llm.generate(wl.prompts, params, use_tqdm=args.progress)
    wall = time.perf_counter() - t
    stats = llm.stats()
    out_tokens = sum(len(o.token_ids) for o in outs)
    assert out_tokens == wl.output_tokens, (out_tokens, wl.output_tokens)
    row = {
        "engine": f"tokenmill {name}", "dtype": dtype, "wall_s": wall,
        "output_tok_s": out_tokens / wall, "total_tok_s": (out_tokens + wl.prompt_tokens) / wall,
        "kv_waste_at_peak": stats["kv_waste_at_peak"], "kv_peak_blocks": stats["kv_blocks_peak_used"],
        "peak_running": stats["peak_running_seqs"], "mean_running": stats["mean_running_seqs"],
        "prefix_hit_tokens": stats["prefix_cache_hit_tokens"], "preemptions": stats["preemptions"],
        "steps": stats["steps"], "gflops": model_flops(stats, llm.engine.runner.model) / wall / 1e9,
        "kv_used_history": llm.engine.stats_tracker.kv_used_history,
    }
    del llm
    gc.collect()
    return row


def run_hf_static(wl, dtype: str, batch: int, model_dir: Path) -> dict:
    """HF ``generate`` in fixed batches with left padding; EOS ignored by forcing the length.
    Only each request's own budget counts as useful output."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    t = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(wl.prompts), batch):
            prompts, budgets = wl.prompts[i : i + batch], wl.max_tokens[i : i + batch]
            width = max(len(p) for p in prompts)
            ids = torch.tensor([[2] * (width - len(p)) + p for p in prompts])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
            m = max(budgets)
            model.generate(ids, attention_mask=mask, max_new_tokens=m, min_new_tokens=m, do_sample=False,
                           pad_token_id=2)
    wall = time.perf_counter() - t
    return {"engine": f"HF generate static batch {batch}", "dtype": dtype, "wall_s": wall,
            "output_tok_s": wl.output_tokens / wall, "total_tok_s": (wl.output_tokens + wl.prompt_tokens) / wall}


def run_vllm(wl, dtype: str, model_dir: Path) -> dict | None:
    try:
        from vllm import LLM as VLLM
        from vllm import SamplingParams as VSP
        from vllm.inputs import TokensPrompt
    except ImportError:
        return None
    llm = VLLM(str(model_dir), dtype=dtype)
    params = [VSP(max_tokens=m, temperature=0, ignore_eos=True) for m in wl.max_tokens]
    t = time.perf_counter()
    llm.generate([TokensPrompt(prompt_token_ids=p) for p in wl.prompts], params)
    wall = time.perf_counter() - t
    return {"engine": "vLLM CPU", "dtype": dtype, "wall_s": wall, "output_tok_s": wl.output_tokens / wall,
            "total_tok_s": (wl.output_tokens + wl.prompt_tokens) / wall}


def print_table(rows: list[dict], baseline: float | None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="tokenmill engine benchmark")
    for col in ("engine", "dtype", "out tok/s", "total tok/s", "x baseline", "GFLOP/s (ceiling)", "KV waste",
                "peak run", "prefix hits", "preempt", "wall s"):
        table.add_column(col)
    for r in rows:
        def fmt(k, spec, r=r):
            return format(r[k], spec) if k in r else "-"
        ratio = f"{r['output_tok_s'] / baseline:.1f}" if baseline else "-"
        gf = f"{r['gflops']:.0f} ({r['ceiling']:.0f})" if "gflops" in r else "-"
        table.add_row(r["engine"], r["dtype"], fmt("output_tok_s", ".1f"), fmt("total_tok_s", ".1f"), ratio, gf,
                      fmt("kv_waste_at_peak", ".1%"), fmt("peak_running", "d"), fmt("prefix_hit_tokens", "d"),
                      fmt("preemptions", "d"), fmt("wall_s", ".1f"))
    Console(width=200).print(table)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5))
    labels = [f"{r['engine']}\n{r['dtype']}" for r in rows]
    ax1.barh(labels, [r["output_tok_s"] for r in rows])
    ax1.set_xlabel("useful output tokens/s")
    for r in rows:
        if "kv_used_history" in r:
            ax2.plot(r["kv_used_history"], label=f"{r['engine']} {r['dtype']}")
    ax2.set_xlabel("step")
    ax2.set_ylabel("KV blocks in use")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--dtypes", nargs="+", default=["float32"])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-batched-tokens", type=int, default=2048)
    ap.add_argument("--hf", action="store_true", help="also run HF generate static batches (slow)")
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--vllm", action="store_true", help="also run vLLM's CPU backend if installed")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)

    from engine.model_registry import resolve_model

    model_dir = resolve_model(args.model)
    from transformers import AutoTokenizer

    wl = workload_mod.build(AutoTokenizer.from_pretrained(model_dir), args.requests)
    print(f"workload: {args.requests} requests, {wl.prompt_tokens} prompt tokens, {wl.output_tokens} output tokens; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores")
    rows = []
    for dtype in args.dtypes:
        ceiling = matmul_ceiling(getattr(torch, dtype))
        for name in args.configs:
            row = run_tokenmill(name, dict(CONFIGS[name]), dtype, wl, args)
            row["ceiling"] = ceiling
            rows.append(row)
            print(f"  {row['engine']} {dtype}: {row['output_tok_s']:.1f} out tok/s, {row['wall_s']:.1f} s", flush=True)
        if args.vllm:
            r = run_vllm(wl, dtype, model_dir)
            if r:
                rows.append(r)
    baseline = None
    if args.hf:
        r = run_hf_static(wl, "float32", args.hf_batch, model_dir)
        rows.append(r)
        baseline = r["output_tok_s"]
    print_table(rows, baseline)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"engine-{stamp}.json").write_text(json.dumps(
        {"requests": args.requests, "prompt_tokens": wl.prompt_tokens, "output_tokens": wl.output_tokens,
         "rows": rows}, indent=1))
    plot(rows, out / f"engine-{stamp}.png")
    print(f"wrote {out}/engine-{stamp}.json and .png")


if __name__ == "__main__":
    main()
