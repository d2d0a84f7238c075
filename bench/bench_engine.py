"""tokenmill beside vLLM's CPU backend and HF ``generate``, in one run, on three workloads.

Workloads (bench/workload.py, built from Python standard-library docstrings): ``summ-64`` and
``summ-256`` (summarisation, long-tailed budgets 16-512) and ``fewshot-48`` (an 8-shot
evaluation set: 48 prompts of 750-850 tokens sharing about 700, answers of 8-32 tokens; run
with tokenmill's prefix cache on and off). EOS is ignored everywhere, so every engine
produces exactly the same tokens' worth of work from the same prompt token ids.

Per dtype, one tokenmill engine and (``--vllm``) one vLLM engine in its own virtualenv stay up
while their runs alternate (``--pairs``); the same-run float32/dtype matmul ceiling of the MLP's
shape and the memory bandwidth give each figure its distance to the physical limit.

    .venv/bin/python bench/bench_engine.py --vllm --hf --out bench/published
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import limits  # noqa: E402
import peers  # noqa: E402
import report  # noqa: E402
import sysinfo  # noqa: E402
import workload as workload_mod  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402
from engine.model_registry import DEFAULT_MODEL  # noqa: E402

WORKLOADS = ("summ-64", "summ-256", "fewshot-48")


def build_workloads(tokenizer, names) -> dict:
    out = {}
    for name in names:
        if name.startswith("summ-"):
            out[name] = workload_mod.build(tokenizer, int(name.split("-")[1]))
        else:
            out[name] = workload_mod.build_fewshot(tokenizer, int(name.split("-")[1]))
    return out


def model_flops(stats: dict, model) -> float:
    """FLOPs of the linear layers the engine really computed: every fed token through the
    layers, the LM head only for sampled tokens (attention left out)."""
    embed = model.embed_tokens.weight.numel()
    body = sum(p.numel() for p in model.parameters()) - embed
    fed = stats["prompt_tokens_computed"] + stats["decode_tokens"]
    return 2.0 * body * fed + 2.0 * embed * stats["decode_tokens"]


def run_tokenmill(llm: LLM, wl, prefix_cache: bool, progress: bool = False) -> dict:
    eng = llm.engine
    eng.stats_tracker.__init__(eng.num_kv_blocks, eng.config.block_size)
    eng.scheduler.prefix_query_tokens = eng.scheduler.prefix_hit_tokens = eng.scheduler.num_preemptions = 0
    eng.block_manager.reset_prefix_cache()
    eng.block_manager.enable_prefix_caching = prefix_cache
    params = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True) for m in wl.max_tokens]
    gc.collect()
    t = time.perf_counter()
    outs = llm.generate(wl.prompts, params, use_tqdm=progress)
    wall = time.perf_counter() - t
    eng.block_manager.enable_prefix_caching = True
    stats = llm.stats()
    out_tokens = sum(len(o.token_ids) for o in outs)
    assert out_tokens == wl.output_tokens, (out_tokens, wl.output_tokens)
    return {"engine": "tokenmill" if prefix_cache else "tokenmill, prefix cache off", "wall_s": wall,
            "output_tok_s": out_tokens / wall, "prefix_hit_tokens": stats["prefix_cache_hit_tokens"],
            "gflops": model_flops(stats, eng.runner.model) / wall / 1e9, "steps": stats["steps"],
            "peak_running": stats["peak_running_seqs"], "mean_running": stats["mean_running_seqs"],
            "preemptions": stats["preemptions"], "load": sysinfo.load()}


def run_vllm(peer: peers.VllmPeer, name: str, wl) -> dict:
    r = peer.run(name)
    assert r["output_tokens"] == wl.output_tokens, (r, wl.output_tokens)
    return {"engine": "vLLM", "wall_s": r["wall_s"], "output_tok_s": wl.output_tokens / r["wall_s"],
            "prefix_hit_tokens": r["prefix_hit_tokens"], "load": sysinfo.load()}


@contextlib.contextmanager
def hold(path: str | None, log: list):
    """Create ``path`` while measuring (other jobs on the machine pause while it exists); a file
    already there (held by whoever started the run) is left in place."""
    if path is None:
        yield
        return
    ours = not Path(path).exists()
    if ours:
        Path(path).write_text("perf: bench_engine.py measuring (removed between phases and at the end)\n")
    log.append({"held_from": time.time(), "settle_s": sysinfo.wait_for_idle(), "load_at_start": sysinfo.load()})
    try:
        yield
    finally:
        if ours:
            Path(path).unlink(missing_ok=True)
        log[-1]["held_s"] = time.time() - log[-1]["held_from"]


def new_engine(args, dtype: str, wl) -> LLM:
    llm = LLM(args.model, dtype=dtype, max_num_batched_tokens=args.max_batched_tokens,
              kv_cache_memory_gb=args.kv_gb)
    # Warm-up: spreads of batch sizes and prompt lengths before anything is timed.
    warm = wl.prompts[:12]
    llm.generate([p[: 48 + 16 * i] for i, p in enumerate(warm)],
                 [SamplingParams(max_tokens=2 + 3 * i, temperature=0) for i in range(len(warm))])
    return llm


def measure_dtype(args, dtype: str, wls: dict, model_dir: Path, rows: list, hold_log: list) -> dict:
    llm = new_engine(args, dtype, next(iter(wls.values())))
    peer = peers.VllmPeer(args.vllm_launcher, model_dir, dtype, wls, Path(tempfile.gettempdir()) / "tokenmill-bench") if args.vllm else None
    phase = {"dtype": dtype, "vllm": peer.info if peer else None}
    try:
        with hold(args.hold, hold_log):
            for key, dt in {"float32": torch.float32, dtype: getattr(torch, dtype)}.items():
                phase[f"matmul_gflops_{key}"] = sysinfo.matmul_gflops(dt)
                phase[f"matmul_gflops_packed_{key}"] = sysinfo.matmul_gflops(dt, packed=True)
            phase["matmul_gflops"] = phase[f"matmul_gflops_{dtype}"]
            # The ceiling: the fastest of the four, since a bfloat16 model may multiply through a
            # float32 copy of its weights (engine/models/linear.py, where bfloat16 products lose)
            # and MKL's plain product is the slower one on AMD.
            phase["ceiling_gflops"] = max(v for k, v in phase.items() if k.startswith("matmul_gflops_"))
            phase["bandwidth_gbs"] = sysinfo.bandwidth_gbs()
            for name, wl in wls.items():
                pairs = args.pairs if name in args.pairs_on else 1
                for rep in range(pairs):
                    runs = [lambda wl=wl: run_tokenmill(llm, wl, True, args.progress)]
                    if name.startswith("fewshot"):
                        runs.append(lambda wl=wl: run_tokenmill(llm, wl, False, args.progress))
                    if peer:
                        runs.append(lambda name=name, wl=wl: run_vllm(peer, name, wl))
                    for fn in runs if rep % 2 == 0 else runs[::-1]:
                        row = {"workload": name, "dtype": dtype, "rep": rep, **fn()}
                        rows.append(row)
                        print(f"  {name} {dtype} {row['engine']}: {row['output_tok_s']:.1f} out tok/s, "
                              f"{row['wall_s']:.1f} s", flush=True)
        m = llm.engine.runner.model
        weight_bytes = sum(p.numel() * p.element_size() for p in m.parameters())
        phase["limits"] = {name: limits.limit(wl, m, phase["ceiling_gflops"], phase["bandwidth_gbs"], weight_bytes)
                           for name, wl in wls.items()}
    finally:
        if peer:
            peer.close()
        llm.engine = None  # free the KV pool before the next phase
        gc.collect()
    return phase


def measure_hf(args, wl, model_dir: Path, rows: list, hold_log: list) -> None:
    """HF ``generate`` static batches on the first ``--hf-requests`` requests, and tokenmill on
    the same subset (float32)."""
    sub = workload_mod.Workload(wl.prompts[: args.hf_requests], wl.max_tokens[: args.hf_requests])
    llm = new_engine(args, "float32", sub)
    with hold(args.hold, hold_log):
        r = run_tokenmill(llm, sub, True)
        rows.append({"workload": f"summ-64 first {args.hf_requests}", "dtype": "float32", "rep": 0, **r})
        del llm
        gc.collect()
        wall = peers.hf_static(model_dir, sub.prompts, sub.max_tokens, "float32", args.hf_batch)
        rows.append({"workload": f"summ-64 first {args.hf_requests}", "dtype": "float32", "rep": 0,
                     "engine": f"HF generate, static batches of {args.hf_batch}", "wall_s": wall,
                     "output_tok_s": sub.output_tokens / wall, "load": sysinfo.load()})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--pairs", type=int, default=3, help="alternating runs per engine on --pairs-on workloads")
    ap.add_argument("--pairs-on", nargs="*", default=["summ-64", "fewshot-48"])
    ap.add_argument("--max-batched-tokens", type=int, default=2048)
    ap.add_argument("--kv-gb", type=float, default=4.0, help="tokenmill KV pool (vLLM's default run: 4 GiB)")
    ap.add_argument("--vllm", action="store_true", help="run vLLM's CPU backend beside tokenmill")
    ap.add_argument("--vllm-launcher", default=str(peers.DEFAULT_LAUNCHER))
    ap.add_argument("--hf", action="store_true", help="HF generate static batches (float32, on a subset)")
    ap.add_argument("--hf-requests", type=int, default=16)
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--hold", help="file to create while measuring (others pause while it exists)")
    ap.add_argument("--hold-gap", type=float, default=60.0, help="seconds the hold is released between phases")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so the hold file is removed

    from transformers import AutoTokenizer

    from engine.host import tune_for_cpu
    from engine.model_registry import resolve_model

    model_dir = resolve_model(args.model)
    tune_for_cpu(None)
    wls = build_workloads(AutoTokenizer.from_pretrained(model_dir), args.workloads)
    machine = sysinfo.cpu_info()
    print(sysinfo.describe(machine), flush=True)
    result = {"command": " ".join(sys.argv), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": machine,
              "load_before": sysinfo.load(), "args": vars(args), "holds": [], "rows": [], "phases": [],
              "workloads": {k: {"requests": len(w.prompts), "prompt_tokens": w.prompt_tokens,
                                "output_tokens": w.output_tokens, "shared_prefix": w.shared_prefix}
                            for k, w in wls.items()}}
    for i, dtype in enumerate(args.dtypes):
        if i and args.hold:
            time.sleep(args.hold_gap)
        result["phases"].append(measure_dtype(args, dtype, wls, model_dir, result["rows"], result["holds"]))
    if args.hf:
        if args.hold:
            time.sleep(args.hold_gap)
        measure_hf(args, build_workloads(AutoTokenizer.from_pretrained(model_dir), ["summ-64"])["summ-64"],
                   model_dir, result["rows"], result["holds"])
    result["load_after"] = sysinfo.load()
    result["summary"] = report.summarise(result)
    report.print_tables(result)
    sysinfo.write_result(args.out, "engine-vs-vllm", result)


if __name__ == "__main__":
    main()
