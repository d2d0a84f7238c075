"""Quantized SmolLM2 beside its float self: int8 W8A8 and 4-bit W4A16 (compressed-tensors, written
here from the packaged float weights by tests/quant_checkpoints.py) against float32 and bfloat16,
in one run, variants alternating round by round (order reversed every round).

Measured: the uniform batch (``--prompts`` random prompts of ``--prompt-len`` tokens, ``--out-len``
output tokens each, EOS ignored), the summarisation workload (``--summ`` requests of
``bench/workload.py``, long-tailed outputs; 0 skips it), the few-sequence decode case (``--decode-seqs`` sequences), resident
weight bytes, the same-run matmul ceiling (float32, bfloat16 and int8 products of the MLP's shape,
torch's plain ones and the engine's own)
and perplexity on a held-out text (``--ppl-file``, its first ``--ppl-tokens`` tokens in 512-token
windows) through the engine's prompt logprobs.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_quantized.py --out bench/published
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import workload as workload_mod  # noqa: E402
from quant_checkpoints import weight_bytes, write_quantized  # noqa: E402
from sysinfo import cpu_info  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402
from engine.cpu_info import cpu_flags  # noqa: E402
from engine.model_registry import DEFAULT_MODEL, cache_dir, resolve_model  # noqa: E402
from engine.models.linear import Linear  # noqa: E402
from engine.quant.checkpoint import QuantWeight  # noqa: E402
from engine.quant.linear import Int8Linear, exact_int8_gemm  # noqa: E402

SIMD = ("avx", "vnni", "amx", "fma", "f16c")


def simd_flags() -> dict:
    """The CPU's vector flags and whether the int8 product ran on VNNI (``torch._int_mm``)."""
    return {"flags": sorted(f for f in cpu_flags() if any(k in f for k in SIMD)), "int8_int_mm": exact_int8_gemm()}


def checkpoints(int4_kind: str, group: int, fp8: bool, extra: list[str]) -> dict[str, tuple[Path, str, str]]:
    """``(folder, dtype, quantization)`` by variant name. ``group``: 576 and 1536 are multiples of
    32 and 64, not of llm-compressor's default 128. ``extra``: ``NAME=FOLDER`` checkpoints made
    elsewhere (``bench/quant_calibrated.py``: GPTQ). The packaged model is a Q4_1 GGUF: its float
    baselines are dequantised (``quantization="none"``); ``gguf-q4_1`` runs it as stored with bfloat16
    rows, ``gguf-q4_1-float32`` as ``LLM()`` does by default."""
    src = resolve_model(DEFAULT_MODEL)
    out = {"float32": (src, "float32", "none"), "bfloat16": (src, "bfloat16", "none"),
           "gguf-q4_1": (src, "bfloat16", "auto"), "gguf-q4_1-float32": (src, "float32", "auto")}
    kinds = [("int8", "int8-w8a8"), (int4_kind, "int4-w4a16")] + ([("fp8", "fp8")] if fp8 else [])
    for kind, name in kinds:
        folder = cache_dir() / "quantized" / f"{DEFAULT_MODEL}-{kind}-g{group}"
        if not (folder / "config.json").is_file():
            write_quantized(src, folder, kind, group)
        out[name] = (folder, "bfloat16", "auto")  # the float parts (attention, LM head) run in bfloat16
    for item in extra:
        name, _, folder = item.partition("=")
        out[name] = (Path(folder).expanduser(), "bfloat16", "auto")
    return out



def linear_bytes(llm: LLM) -> int:
    total = 0
    for layer in llm.engine.runner.model.layers:
        for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            total += sum(t.numel() * t.element_size() for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]
                         if t is not None)
    return total


def timed(llm: LLM, prompts, params) -> tuple[float, int]:
    """Seconds and output tokens of one ``generate``, every prompt token computed: the prefix cache
    is emptied first, as bench_engine.py and the vLLM peers do. Before 2026-12-08 it was not, so
    every round after the first (the warm round included) found the uniform batch's prompts
    cached and timed little more than its decode (bench_llamacpp.py's tokenmill side too)."""
    llm.engine.block_manager.reset_prefix_cache()
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    return time.perf_counter() - t, sum(len(o.token_ids) for o in outs)


def scored(llm: LLM, ids: list[int], window: int = 512) -> tuple[list[float], list[int]]:
    """Each held-out token's log-probability and the model's most likely token at its position."""
    chunks = [ids[i:i + window] for i in range(0, len(ids) - 1, window) if len(ids[i:i + window]) > 1]
    outs = llm.generate(chunks, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1))
    logprobs, top1 = [], []
    for chunk, out in zip(chunks, outs, strict=True):
        for tok, pos in zip(chunk[1:], out.prompt_logprobs[1:], strict=True):
            logprobs.append(pos[tok].logprob)
            top1.append(next(t for t, lp in pos.items() if lp.rank == 1))
    return logprobs, top1


def perplexity(llm: LLM, ids: list[int], window: int = 512) -> float:
    logprobs, _ = scored(llm, ids, window)
    return math.exp(-sum(logprobs) / len(logprobs))


def quality(logprobs: list[float], top1: list[int], ref_logprobs: list[float], ref_top1: list[int]) -> dict:
    """Perplexity, and against the float32 reference: the per-token log-likelihood difference's
    mean with its standard error (the perplexity ratio's noise), and top-1 agreement."""
    n = len(logprobs)
    diff = [a - b for a, b in zip(logprobs, ref_logprobs, strict=True)]
    mean = sum(diff) / n
    se = math.sqrt(sum((d - mean) ** 2 for d in diff) / (n - 1) / n)
    return {"perplexity": round(math.exp(-sum(logprobs) / n), 4), "nll_diff_vs_float32": round(-mean, 5),
            "nll_diff_se": round(se, 5), "top1_agree_vs_float32": round(sum(a == b for a, b in zip(top1, ref_top1, strict=True)) / n, 4)}


def matmul_ceiling(rows: int = 256) -> dict[str, float]:
    """GFLOP/s (GOP/s for int8) of one [rows x 576] x [576 x 1536] product, median of 9: torch's
    plain products (``torch.mm``, ``torch._int_mm``), and the engine's own (``*_engine``: the
    oneDNN-packed ``Linear`` and ``Int8Linear`` with its quantize and scaling), which is what a
    variant's products run at. The plain bfloat16 ``torch.mm`` ran at 414 in one run on a Zen 4
    (quantization-20261128-141451.json); on a Zen 5 the packed product ran at 854-1,020."""
    k, n = 576, 1536
    packed = Linear(k, n, bias=False).to(torch.bfloat16)
    packed.pack()
    qw = QuantWeight(torch.randint(-127, 128, (n, k), dtype=torch.int8), torch.rand(n, 1) * 0.01, None, k)
    int8 = Int8Linear(qw, None)
    xb = torch.randn(rows, k).bfloat16()
    cases = {"float32": (torch.mm, torch.randn(rows, k), torch.randn(k, n)),
             "bfloat16": (torch.mm, xb, torch.randn(k, n).bfloat16()),
             "int8": (torch._int_mm, torch.randint(-127, 127, (rows, k), dtype=torch.int8),
                      torch.randint(-127, 127, (k, n), dtype=torch.int8)),
             "bfloat16_engine": (packed, xb), "int8_engine": (int8, xb)}
    out = {}
    with torch.inference_mode():
        for name, (fn, *args) in cases.items():
            fn(*args)
            times = []
            for _ in range(9):
                t = time.perf_counter()
                fn(*args)
                times.append(time.perf_counter() - t)
            out[name] = round(2 * rows * k * n / statistics.median(times) / 1e9, 1)
    return out


def uniform_gflop(prompts: int, prompt_len: int, out_len: int) -> float:
    """The uniform batch's work in GFLOP: the layers' linears for every token (0.212 GFLOP each)
    and the LM head only where a token is sampled (0.057 GFLOP), as the engine runs it."""
    return (prompts * (prompt_len + out_len) * 0.212 + prompts * out_len * 0.057)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=338)
    ap.add_argument("--out-len", type=int, default=96)
    ap.add_argument("--summ", type=int, default=64, help="summarisation requests (bench/workload.py); 0 skips")
    ap.add_argument("--decode-seqs", type=int, default=2)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warm-rounds", type=int, default=1, help="untimed rounds first (first touch of the KV pool, oneDNN's kernels)")
    ap.add_argument("--ppl-file", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--ppl-tokens", type=int, default=2048)
    ap.add_argument("--int4", default="int4", choices=["int4", "int4-asym"], help="symmetric, or with zero points")
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--fp8", action="store_true", help="also an FP8 (dequantised on the CPU) checkpoint")
    ap.add_argument("--extra", action="append", default=[], help="NAME=FOLDER: another checkpoint (e.g. GPTQ)")
    ap.add_argument("--out", default="bench/published")
    args = ap.parse_args()
    rng = random.Random(0)
    uniform = [[rng.randrange(3, 49152) for _ in range(args.prompt_len)] for _ in range(args.prompts)]
    few = [[rng.randrange(3, 49152) for _ in range(64)] for _ in range(args.decode_seqs)]
    blocks = args.prompts * -(-(args.prompt_len + args.out_len) // 16) + 64
    llms, result = {}, {"command": " ".join(sys.argv), "cpu": cpu_info() | simd_flags(), "variants": {}}
    print("cpu", result["cpu"], flush=True)
    for name, (folder, dtype, quant) in checkpoints(args.int4, args.group, args.fp8, args.extra).items():
        llm = llms[name] = LLM(str(folder), dtype=dtype, quantization=quant, num_kv_blocks=blocks)
        result["variants"][name] = {"folder": str(folder), "dtype": dtype, "runs": llm.engine.quantization,
                                    "weight_bytes": weight_bytes(llm), "linear_bytes": linear_bytes(llm),
                                    "uniform_s": [], "decode_s": [], "summ_s": []}
        if (folder / "calibration.json").is_file():  # how bench/quant_calibrated.py made it
            result["variants"][name]["calibration"] = json.loads((folder / "calibration.json").read_text())
        llm.generate(few, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))  # warm
    result["matmul_ceiling_gflops"] = matmul_ceiling()
    base = result["variants"]
    for v in base.values():
        v["weight_bytes_vs_float32"] = round(v["weight_bytes"] / base["float32"]["weight_bytes"], 3)
        v["linear_bytes_vs_float32"] = round(v["linear_bytes"] / base["float32"]["linear_bytes"], 3)
    tokenizer = llms["float32"].engine.tokenizer
    summ = workload_mod.build(tokenizer, args.summ) if args.summ else None
    summ_params = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True) for m in summ.max_tokens] if summ else []
    if summ:
        result["summ"] = {"requests": args.summ, "prompt_tokens": summ.prompt_tokens, "output_tokens": summ.output_tokens}
    ids = tokenizer(Path(args.ppl_file).read_text())["input_ids"][: args.ppl_tokens]
    result["ppl_text"] = {"file": args.ppl_file, "tokens": len(ids)}
    scores = {name: scored(llm, ids) for name, llm in llms.items()}  # quality first: it survives a run cut short
    for name, (logprobs, top1) in scores.items():
        base[name].update(quality(logprobs, top1, *scores["float32"]))
    for v in base.values():
        v["ppl_vs_own_float"] = round(v["perplexity"] / base["float32"]["perplexity"] - 1, 4)
    out = Path(args.out) / f"quantization-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: {kk: v.get(kk) for kk in ("runs", "perplexity", "ppl_vs_own_float", "nll_diff_se",
                                                     "top1_agree_vs_float32", "weight_bytes_vs_float32")}
                      for k, v in base.items()}, indent=1), flush=True)
    names = list(llms)
    flops = uniform_gflop(args.prompts, args.prompt_len, args.out_len) * 1e9
    result["uniform_gflop"] = round(flops / 1e9, 1)
    for _ in range(args.warm_rounds):  # a cold first round ran 2-4x slower than the next ones here
        for name in names:
            timed(llms[name], uniform, SamplingParams(max_tokens=args.out_len, temperature=0, ignore_eos=True))
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            v = base[name]
            secs, toks = timed(llms[name], uniform, SamplingParams(max_tokens=args.out_len, temperature=0, ignore_eos=True))
            v["uniform_s"].append(round(secs, 2))
            secs, _ = timed(llms[name], few, SamplingParams(max_tokens=args.decode_tokens, temperature=0, ignore_eos=True))
            v["decode_s"].append(round(secs, 3))
            if summ:
                secs, _ = timed(llms[name], summ.prompts, summ_params)
                v["summ_s"].append(round(secs, 2))
            print(name, "uniform", v["uniform_s"][-1], "decode", v["decode_s"][-1], "summ", v["summ_s"][-1:], flush=True)
        for v in base.values():
            v["uniform_median_s"] = statistics.median(v["uniform_s"])
        for v in base.values():
            v["uniform_out_tok_s"] = round(args.prompts * args.out_len / v["uniform_median_s"], 1)
            v["decode_out_tok_s"] = round(args.decode_seqs * args.decode_tokens / statistics.median(v["decode_s"]), 1)
            v["speed_vs_bfloat16"] = round(base["bfloat16"]["uniform_median_s"] / v["uniform_median_s"], 3)
            v["decode_vs_bfloat16"] = round(statistics.median(base["bfloat16"]["decode_s"]) / statistics.median(v["decode_s"]), 3)
            if summ:
                v["summ_vs_bfloat16"] = round(statistics.median(base["bfloat16"]["summ_s"]) / statistics.median(v["summ_s"]), 3)
            v["uniform_gflops"] = round(flops / v["uniform_median_s"] / 1e9, 1)
        result["rounds_done"] = r + 1
        out.write_text(json.dumps(result, indent=1))  # after every round: a cut run keeps what it has
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk not in ("folder",)} for k, v in base.items()}, indent=1))
    print("ceiling", result["matmul_ceiling_gflops"], "->", out)


if __name__ == "__main__":
    main()
