"""Throughput on one GPU: tokenmill vs HF transformers (continuous batching and static batches)
on a random-weight model of Llama-3.2-1B's shape, the summarisation workload, bfloat16, EOS ignored.

    PYTHONPATH=$PWD python bench/gpu/gpu_throughput.py --out $OUT/gpu-throughput.json --requests 256 1024

Every run gets exactly the workload's per-request output budgets (bench/gpu/summ-1024.json);
HF static batches decode to the longest budget of their batch, so their useful output is the same
total. Times exclude start-up (reported separately) and a warm-up generate.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import LLAMA_1B, Recorder, build_model, device_meta, free  # noqa: E402
from hf_baselines import hf_continuous, hf_static  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402

COPY_TBPS, BF16_TFLOPS = 4.3, 790.0  # measured ceilings (device README); re-measured in `ceilings`




def ceilings() -> dict:
    """Device-to-device copy (bytes read + written) and a bf16 8192^3 matmul, on this machine now."""
    from triton.testing import do_bench

    x = torch.randn(2**30 // 2, dtype=torch.bfloat16, device="cuda")  # 1 GiB
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x), warmup=50, rep=300, return_mode="median")
    a, b = (torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    mm = do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median")
    return {"copy_tb_per_s": 2 * x.numel() * 2 / ms / 1e9, "bf16_matmul_tflops": 2 * 8192**3 / mm / 1e9}


def floor_seconds(prompts, budgets, steps: int, params: int, kv_bytes_per_token: int, ceil: dict) -> dict:
    """The fewest seconds the work can take: weights read once per step plus every decode's KV
    context read once, at copy bandwidth; or 2 * params FLOPs per token at the matmul rate."""
    ctx = sum(budget * len(p) + budget * (budget - 1) // 2 for p, budget in zip(prompts, budgets, strict=True))
    tokens = sum(map(len, prompts)) + sum(budgets)
    embed = LLAMA_1B["vocab_size"] * LLAMA_1B["hidden_size"]  # tied: a lookup per token, a product per sampled row
    bytes_ = steps * params * 2 + ctx * kv_bytes_per_token
    flops = 2 * (params - embed) * tokens + 2 * embed * sum(budgets) + 4 * ctx * LLAMA_1B["num_attention_heads"] * LLAMA_1B["head_dim"] * LLAMA_1B["num_hidden_layers"]
    mem_s, flop_s = bytes_ / (ceil["copy_tb_per_s"] * 1e12), flops / (ceil["bf16_matmul_tflops"] * 1e12)
    return {"memory_floor_s": mem_s, "compute_floor_s": flop_s, "floor_s": max(mem_s, flop_s), "steps": steps,
            "weight_gb_per_step": params * 2 / 1e9, "kv_gb_read": ctx * kv_bytes_per_token / 1e9}


class StepTimer:
    """Host wall time of each phase of ``LLMEngine.step``: schedule, prepare, launch (the forward's
    host side; graphs and kernels run on asynchronously), sample (waits for the GPU), the rest."""

    def __init__(self, engine) -> None:
        self.t = dict.fromkeys(("schedule", "prepare", "launch", "sample"), 0.0)
        self.steps = 0
        self._wrap(engine.scheduler, "schedule", "schedule")
        self._wrap(engine.runner, "prepare", "prepare")
        self._wrap(engine, "_sample", "sample")
        runner = engine.runner
        inner = runner.execute

        def execute(batch):
            t0 = time.perf_counter()
            out = inner(batch)
            self.t["launch"] += time.perf_counter() - t0
            self.steps += 1
            return out

        runner.execute = execute

    def _wrap(self, obj, name: str, key: str) -> None:
        inner = getattr(obj, name)

        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                self.t[key] += time.perf_counter() - t0

        setattr(obj, name, timed)

    def result(self, wall: float) -> dict:
        t = dict(self.t)
        t["launch"] -= t["prepare"]  # execute includes prepare
        t["other"] = wall - sum(t.values())
        return {"steps": self.steps, "ms_per_step": {k: 1e3 * v / max(self.steps, 1) for k, v in t.items()}}


def tokenmill(model_dir: Path, prompts, budgets, settings: dict, ceil: dict, profile_dir: Path | None,
              fused: bool = True, passes: int = 1) -> dict:
    """With ``passes`` > 1: one untimed pass first (every Triton variant the workload needs gets
    compiled), then ``passes`` timed ones. Each pass shifts every token id by a different amount,
    so no pass finds another's prompts in the prefix cache; the last pass is the one reported."""
    from engine.models import fused_triton

    fused_triton.ENABLED = fused
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    llm = LLM(str(model_dir), **settings)
    startup = time.perf_counter() - t0
    graphs = llm.engine.runner.decode_graphs
    warm = [[5 + i] * (40 + 50 * i) for i in range(8)]
    llm.generate(warm, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    params = [SamplingParams(max_tokens=b, temperature=0, ignore_eos=True) for b in budgets]
    vocab = llm.engine.runner.model.config.vocab_size
    if passes > 1:
        llm.generate([[(t + 1) % vocab for t in p] for p in prompts], params)
    timer = StepTimer(llm.engine)
    walls = []
    for shift in range(0, 2 * passes, 2):
        timer.t = dict.fromkeys(timer.t, 0.0)
        timer.steps = 0
        steps_before = llm.stats()["steps"]
        batch = prompts if shift == 0 else [[(t + shift) % vocab for t in p] for p in prompts]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        outs = llm.generate(batch, params)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    wall = walls[-1]
    out_tokens = sum(len(o.token_ids) for o in outs)
    stats = llm.stats()
    free_b, total_b = torch.cuda.mem_get_info()
    cfg = llm.engine.runner.model.config
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * llm.engine.runner.model.head_dim * 2
    n_params = sum(p.numel() for p in llm.engine.runner.model.parameters())
    res = {
        "settings": settings, "triton_fused_norm_rotary": fused, "requests": len(prompts), "timed_passes_wall_s": walls, "startup_s": startup, "wall_s": wall,
        "output_tokens": out_tokens, "expected_output_tokens": sum(budgets), "output_tok_per_s": out_tokens / wall,
        "prompt_tokens": sum(map(len, prompts)), "errors": sum(o.error is not None for o in outs),
        "kv_pool_blocks": llm.engine.num_kv_blocks, "kv_pool_gib": llm.engine.runner.kv_pool.nbytes / 2**30,
        "gpu_used_gib": (total_b - free_b) / 2**30, "torch_peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "params": n_params, "stats": stats, "host_breakdown": timer.result(wall),
        "floor": floor_seconds(prompts, budgets, stats["steps"] - steps_before, n_params, kv_per_token, ceil),
    }
    res["fraction_of_floor"] = res["floor"]["floor_s"] / wall
    if graphs is not None:
        res["graphs"] = {"capture_s": graphs.capture_seconds, "sizes": graphs.batch_sizes,
                         "replays": graphs.replays, "graph_steps": graphs.steps}
        res["decode_step_device_ms"] = decode_step_times(llm, graphs)
    if profile_dir is not None:
        res["profile"] = profile_steps(llm, prompts[:256], profile_dir)
    print(f"  tokenmill {len(prompts)} req: {out_tokens} tok in {wall:.2f}s = {out_tokens / wall:.0f} tok/s "
          f"(floor {res['floor']['floor_s']:.2f}s), startup {startup:.1f}s, "
          f"breakdown {({k: round(v, 2) for k, v in res['host_breakdown']['ms_per_step'].items()})}", flush=True)
    del llm, outs
    fused_triton.ENABLED = True
    free()
    return res


def decode_step_times(llm, graphs) -> dict:
    """Device time of one decode step at a few batch sizes: graph replay vs the eager forward
    (the difference is launch overhead). The graphs' buffers hold whatever the last step left,
    replays read the frozen metadata, so this is timing only."""
    from triton.testing import do_bench

    out = {}
    for size in (1, 32, 256):
        if size not in graphs.graphs:
            continue
        replay = do_bench(graphs.graphs[size].replay, warmup=20, rep=200, return_mode="median")
        with torch.inference_mode():
            eager = do_bench(lambda s=size: graphs._forward(s), warmup=5, rep=100, return_mode="median")
        out[size] = {"graph_ms": replay, "eager_ms": eager}
    return out


def profile_steps(llm, prompts, out_dir: Path) -> dict:
    """torch.profiler over 10 decode steps of a 256-sequence batch; tables written to ``out_dir``."""
    from torch.profiler import ProfilerActivity, profile

    eng = llm.engine
    for i, p in enumerate(prompts):
        eng.add_request(f"prof-{i}", p, SamplingParams(max_tokens=64, temperature=0, ignore_eos=True))
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in eng.scheduler.running) or eng.scheduler.waiting:
        eng.step()
    for _ in range(3):
        eng.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(10):
            eng.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    ka = prof.key_averages()
    (out_dir / "profile-decode.txt").write_text(
        ka.table(sort_by="cuda_time_total", row_limit=25) + "\n\n" + ka.table(sort_by="cpu_time_total", row_limit=25))
    eng.abort_all()
    while eng.has_unfinished():
        eng.step()
    cuda_total = sum(e.self_device_time_total for e in ka) / 1e3 if hasattr(ka[0], "self_device_time_total") else None
    return {"steps": 10, "wall_ms_per_step": wall * 100, "cuda_self_ms_per_step": cuda_total / 10 if cuda_total else None}






def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--requests", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--workload", type=Path, default=Path(__file__).with_name("summ-1024.json"))
    ap.add_argument("--skip", nargs="*", default=[], help="hf-continuous hf-static tokenmill-tuned profile")
    ap.add_argument("--static-batch", type=int, default=256)
    ap.add_argument("--passes", type=int, default=1, help="timed passes per tokenmill config (>1: after a warm one)")
    ap.add_argument("--defaults", action="store_true", help="also run LLM(model, dtype='bfloat16') with every other setting default")
    ap.add_argument("--hf-requests", type=int, nargs="*", default=None, help="request counts HF runs at (default: all)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    rec = Recorder(args.out, device_meta() | {"script": "bench/gpu/gpu_throughput.py", "argv": sys.argv[1:]})
    wl = json.loads(args.workload.read_text())
    model_dir = rec.run("build-1b", lambda: build_model(Path(tempfile.mkdtemp()) / "llama-1b-shape", "cuda",
                                                         dtype=torch.bfloat16, **LLAMA_1B))
    ceil = rec.run("ceilings", ceilings) or {"copy_tb_per_s": COPY_TBPS, "bf16_matmul_tflops": BF16_TFLOPS}
    base = dict(dtype="bfloat16", attention_backend="triton", enforce_eager=False, max_model_len=4096)
    for n in args.requests:
        prompts, budgets = wl["prompts"][:n], wl["max_tokens"][:n]
        prof = args.out.parent if n == args.requests[0] and "profile" not in args.skip else None
        p = args.passes
        if args.defaults:
            rec.run(f"tokenmill-defaults/{n}", lambda: tokenmill(model_dir, prompts, budgets, dict(dtype="bfloat16", max_model_len=4096), ceil, None, True, p))  # noqa: B023 (called at once)
        rec.run(f"tokenmill/{n}", lambda: tokenmill(model_dir, prompts, budgets, base, ceil, prof, True, p))  # noqa: B023 (called at once)
        if "unfused" not in args.skip:  # A/B: the torch formulations of RMSNorm and rotary
            rec.run(f"tokenmill-unfused/{n}", lambda: tokenmill(model_dir, prompts, budgets, base, ceil, None, False, p))  # noqa: B023 (called at once)
        if "tokenmill-tuned" not in args.skip:
            tuned = base | dict(max_num_seqs=512, max_num_batched_tokens=8192)
            if "unfused" not in args.skip:
                rec.run(f"tokenmill-512seq-8k-unfused/{n}", lambda: tokenmill(model_dir, prompts, budgets, tuned, ceil, None, False, p))  # noqa: B023 (called at once)
            rec.run(f"tokenmill-512seq-8k/{n}", lambda: tokenmill(model_dir, prompts, budgets, tuned, ceil, None, True, p))  # noqa: B023 (called at once)
        hf_here = args.hf_requests is None or n in args.hf_requests
        if "hf-continuous" not in args.skip and hf_here:
            rec.run(f"hf-continuous/{n}", lambda: hf_continuous(model_dir, prompts, budgets))  # noqa: B023 (called at once)
        if "hf-static" not in args.skip and hf_here:
            rec.run(f"hf-static/{n}", lambda: hf_static(model_dir, prompts, budgets, args.static_batch))  # noqa: B023 (called at once)
    print("\nSUMMARY gpu_throughput")
    for name, e in rec.data["sections"].items():
        r = e.get("result") if e["ok"] else None
        if isinstance(r, dict) and "output_tok_per_s" in r:
            extra = f" floor {r['fraction_of_floor']:.0%}" if "fraction_of_floor" in r else ""
            print(f"  {name:28s} {r['output_tok_per_s']:9.0f} out tok/s  wall {r['wall_s']:7.2f}s  "
                  f"gpu {r.get('gpu_used_gib', 0):6.1f} GiB{extra}")
        else:
            print(f"  {name:28s} {'ok' if e['ok'] else 'FAILED ' + e.get('error', '')[:120]} ({e['seconds']}s)")


if __name__ == "__main__":
    main()
