"""Every model family tokenmill runs, beside vLLM's CPU backend, on one random-weight checkpoint each.

One checkpoint per family of the same moderate shape (4 layers, hidden 512, 8 query heads of
head_dim 64 over 2 KV heads, intermediate 1024; the MoE families 8 experts, top 2, expert
intermediate 256), with the default model's tokenizer, so its vocabulary (49152) is the one the
prompt ids need. Per family: tokenmill runs the summarisation workload once (float32, EOS
ignored, as bench_engine.py does), then once more with timers on every part (profile_step.py's
``instrument``) for where the time goes; then vLLM's CPU backend runs the same token ids once in
its own virtualenv. A family vLLM cannot load is reported with its error.

    .venv/bin/python bench/bench_families.py --out bench/published
"""

from __future__ import annotations

import argparse
import gc
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import bench_engine  # noqa: E402
import peers  # noqa: E402
import profile_step  # noqa: E402
import sysinfo  # noqa: E402
import workload as workload_mod  # noqa: E402
from model_fixtures import TOKENIZER_FILES  # noqa: E402

WINDOW = 512  # the sliding windows: the longest summ-64 prompts (1400 tokens) cross it
SHAPE = dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, head_dim=64, vocab_size=49152, max_position_embeddings=4096,
             rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
MOE = dict(num_experts_per_tok=2)


def _phi3(t):
    """Phi-4-mini's shape of attention: fused qkv/gate_up tensors, partial rotary 0.75, longrope."""
    rotary = int(64 * 0.75)
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
            "short_factor": [1.0 + 0.05 * i for i in range(rotary // 2)],
            "long_factor": [2.0 + 0.5 * i for i in range(rotary // 2)],
            "original_max_position_embeddings": 4096}
    shape = SHAPE | dict(max_position_embeddings=8192)
    shape.pop("head_dim")  # Phi-3 derives it: 512 / 8 = 64
    return t.Phi3Config(**shape, rope_parameters=rope, original_max_position_embeddings=4096,
                        pad_token_id=0), t.Phi3ForCausalLM


def _gemma3(t):
    """Gemma 3's pattern at this depth: three sliding-window layers, then a global one."""
    return t.Gemma3TextConfig(
        **SHAPE | dict(tie_word_embeddings=True), query_pre_attn_scalar=64, sliding_window=WINDOW, pad_token_id=0,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}), t.Gemma3ForCausalLM


FAMILIES = {
    "llama": lambda t: (t.LlamaConfig(**SHAPE), t.LlamaForCausalLM),
    "qwen3": lambda t: (t.Qwen3Config(**SHAPE), t.Qwen3ForCausalLM),
    "gemma3": _gemma3,
    "phi3": _phi3,
    "mistral-window": lambda t: (t.MistralConfig(**SHAPE, sliding_window=WINDOW), t.MistralForCausalLM),
    # Every layer sparse, top-2 weights renormalised as Qwen3-30B-A3B's
    "qwen3-moe": lambda t: (t.Qwen3MoeConfig(**SHAPE, **MOE, num_experts=8, moe_intermediate_size=256,
                                            norm_topk_prob=True, mlp_only_layers=[], decoder_sparse_step=1),
                            t.Qwen3MoeForCausalLM),
    "mixtral": lambda t: (t.MixtralConfig(**SHAPE | dict(intermediate_size=256), **MOE, num_local_experts=8),
                          t.MixtralForCausalLM),
}


def build_checkpoint(family: str, out: Path, tokenizer_from: Path, seed: int = 0) -> dict:
    """Save the family's random-weight checkpoint with the tokenizer beside it; returns its shape."""
    import transformers

    config, model_cls = FAMILIES[family](transformers)
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).is_file():
            shutil.copy(tokenizer_from / name, out / name)
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "vocab_size", "sliding_window", "layer_types", "num_experts", "num_local_experts",
            "num_experts_per_tok", "moe_intermediate_size", "partial_rotary_factor", "tie_word_embeddings")
    shape = {k: getattr(config, k) for k in keys if getattr(config, k, None) is not None}
    return {"architecture": config.architectures[0] if config.architectures else model_cls.__name__,
            "parameters": sum(p.numel() for p in model.parameters()), "shape": shape}


def moe_gflops(llm, wall: float) -> float:
    """bench_engine.model_flops with only the experts a token is routed to counted (it counts
    every expert's weights, which a mixture of experts never multiplies by all at once)."""
    model, stats = llm.engine.runner.model, llm.stats()
    experts = [m for m in model.modules() if hasattr(m, "num_experts") and hasattr(m, "gate_up")]
    idle = sum((m.gate_up.numel() + m.down.numel()) * (1 - model.config.num_experts_per_tok / m.num_experts)
               for m in experts)
    embed = model.embed_tokens.weight.numel()
    body = sum(p.numel() for p in model.parameters()) - embed - idle
    fed = stats["prompt_tokens_computed"] + stats["decode_tokens"]
    return (2.0 * body * fed + 2.0 * embed * stats["decode_tokens"]) / wall / 1e9


def where_time_goes(llm, wl) -> dict:
    """One more run of the workload with every part timed (profile_step.instrument): prompt
    passes against decode passes, and each part's seconds and share."""
    seconds, steps = profile_step.instrument(llm)
    row = bench_engine.run_tokenmill(llm, wl, True)
    wall = row["wall_s"]
    passes = {kind: {"passes": sum(1 for d, p, _ in steps if bool(p) == (kind == "prompt")),
                     "seconds": sum(s for d, p, s in steps if bool(p) == (kind == "prompt"))}
              for kind in ("prompt", "decode")}
    return {"wall_s": wall, "note": "timers on: a little slower than the measured run",
            "passes": passes, "outside_forward_passes_s": wall - sum(v["seconds"] for v in passes.values()),
            "parts_s": {k.strip(): v for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])},
            "parts_share": {k.strip(): v / wall for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])},
            "passes_by_size": profile_step.step_table(steps)}


def measure_family(args, family: str, wl, tokenizer_from: Path, workdir: Path, hold_log: list) -> dict:
    model_dir = workdir / family
    shutil.rmtree(model_dir, ignore_errors=True)
    entry = {"family": family, **build_checkpoint(family, model_dir, tokenizer_from)}
    print(f"{family} ({entry['architecture']}, {entry['parameters'] / 1e6:.1f}M parameters)", flush=True)
    opts = SimpleNamespace(model=str(model_dir), max_batched_tokens=args.max_batched_tokens, kv_gb=args.kv_gb)
    with bench_engine.hold(args.hold, hold_log):
        try:
            llm = bench_engine.new_engine(opts, "float32", wl)
            entry["tokenmill"] = bench_engine.run_tokenmill(llm, wl, True)
            if "num_experts_per_tok" in entry["shape"]:
                entry["tokenmill"]["gflops"] = moe_gflops(llm, entry["tokenmill"]["wall_s"])
            print(f"  tokenmill: {entry['tokenmill']['output_tok_s']:.1f} out tok/s, "
                  f"{entry['tokenmill']['wall_s']:.1f} s", flush=True)
            if not args.no_profile:
                try:
                    entry["where_time_goes"] = where_time_goes(llm, wl)
                except Exception as exc:
                    entry["where_time_goes"] = {"error": f"{type(exc).__name__}: {exc}"}
                    print(f"  profile FAILED: {exc}", flush=True)
            llm.engine = None  # free the KV pool before vLLM starts
            del llm
            gc.collect()
        except Exception as exc:  # one family's failure must not hide the others'
            entry["tokenmill"] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            print(f"  tokenmill FAILED: {exc}", flush=True)
        if args.vllm:
            entry["vllm"] = run_vllm_family(args, model_dir, wl, workdir / f"{family}-vllm")
    tm, vl = entry.get("tokenmill", {}), entry.get("vllm", {})
    if "output_tok_s" in tm and "output_tok_s" in vl:
        entry["ratio_tokenmill_over_vllm"] = tm["output_tok_s"] / vl["output_tok_s"]
    return entry


def run_vllm_family(args, model_dir: Path, wl, workdir: Path) -> dict:
    """One vLLM run of the workload; a family it cannot load comes back as its error and log tail."""
    peer = None
    try:
        peer = peers.VllmPeer(args.vllm_launcher, model_dir, "float32", {"summ": wl}, workdir)
        row = bench_engine.run_vllm(peer, "summ", wl)
        row["startup_s"] = peer.info.get("startup_s")
        print(f"  vLLM: {row['output_tok_s']:.1f} out tok/s, {row['wall_s']:.1f} s", flush=True)
        return row
    except Exception as exc:
        log = workdir / "vllm-float32.log"
        tail = log.read_text(errors="replace").splitlines()[-30:] if log.exists() else []
        errors = [line for line in tail if "Error" in line or "error" in line]
        print(f"  vLLM FAILED: {exc}; {errors[-1] if errors else ''}", flush=True)
        return {"error": f"{type(exc).__name__}: {exc}", "log_error": errors[-1] if errors else None,
                "log_tail": tail, "log": str(log)}
    finally:
        if peer:
            peer.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    ap.add_argument("--requests", type=int, default=64, help="the first N requests of summ-64")
    ap.add_argument("--max-tokens", type=int, help="cap every output budget (dry runs)")
    ap.add_argument("--max-batched-tokens", type=int, default=2048)
    ap.add_argument("--kv-gb", type=float, default=4.0, help="tokenmill KV pool (vLLM's default run: 4 GiB)")
    ap.add_argument("--no-vllm", dest="vllm", action="store_false", help="tokenmill only")
    ap.add_argument("--vllm-launcher", default=str(peers.DEFAULT_LAUNCHER))
    ap.add_argument("--no-profile", action="store_true", help="skip the timed run (where the time goes)")
    ap.add_argument("--hold", help="file to create while measuring (others pause while it exists)")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so the hold file is removed

    from transformers import AutoTokenizer

    from engine.host import tune_for_cpu
    from engine.model_registry import resolve_model

    tokenizer_from = resolve_model("smollm2-135m-instruct")
    tune_for_cpu(None)
    wl = workload_mod.build(AutoTokenizer.from_pretrained(tokenizer_from), args.requests)
    if args.max_tokens:
        wl = workload_mod.Workload(wl.prompts, [min(m, args.max_tokens) for m in wl.max_tokens])
    machine = sysinfo.cpu_info()
    print(sysinfo.describe(machine), flush=True)
    print(f"summ-64, first {args.requests}: {wl.prompt_tokens} prompt + {wl.output_tokens} output tokens", flush=True)
    result = {"command": " ".join(sys.argv), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": machine,
              "load_before": sysinfo.load(), "args": vars(args), "dtype": "float32", "holds": [],
              "workload": {"name": "summ-64", "requests": len(wl.prompts), "prompt_tokens": wl.prompt_tokens,
                           "output_tokens": wl.output_tokens, "max_tokens_cap": args.max_tokens},
              "families": []}
    workdir = Path(tempfile.gettempdir()) / "tokenmill-bench-families"
    workdir.mkdir(parents=True, exist_ok=True)
    for family in args.families:
        result["families"].append(measure_family(args, family, wl, tokenizer_from, workdir, result["holds"]))
    result["load_after"] = sysinfo.load()
    print(f"{'family':<16}{'tokenmill tok/s':>16}{'vLLM tok/s':>12}{'ratio':>8}")
    for f in result["families"]:
        tm, vl = f.get("tokenmill", {}).get("output_tok_s"), f.get("vllm", {}).get("output_tok_s")
        ratio = f.get("ratio_tokenmill_over_vllm")
        print(f"{f['family']:<16}{tm or float('nan'):>16.1f}{vl or float('nan'):>12.1f}{ratio or float('nan'):>8.2f}")
    sysinfo.write_result(args.out, "families-vs-vllm", result)


if __name__ == "__main__":
    main()
