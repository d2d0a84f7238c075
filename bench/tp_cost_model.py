"""The expected cost of tensor parallelism on H100s linked by NVLink 4, from the model shapes
alone: a model, not a measurement (bench/gpu/tp_check.py measures; docs/performance/tensor-parallel.md).

    python bench/tp_cost_model.py --out bench/published/tp-cost-model-YYYYMMDD.json

Per step, each rank runs 2 all-reduces per layer (after o_proj and down_proj) and one after the
vocabulary-split embedding, each of ``tokens x hidden`` bfloat16 values, and one all-gather of
the sampled rows' logits (``rows x vocab``). A ring all-reduce moves ``2 (N-1)/N`` of the
buffer through each GPU's link, an all-gather ``(N-1)/N`` of the result.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# H100 SXM: NVLink 4 is 900 GB/s per GPU counting both directions; a ring all-reduce sends and
# receives at once, so each direction's 450 GB/s is the bandwidth that bounds it.
LINK_BYTES_S = 450e9
LINK_EFFICIENCY = 0.8  # NCCL's bus bandwidth reaches about this share of the link on large buffers (assumed)
COLLECTIVE_LATENCY_S = 10e-6  # per collective inside one NVLink node, small buffers (assumed)
HBM_BYTES_S = 3.35e12 * 0.8  # H100 SXM HBM3, 80% reached
FLOPS = 989e12 * 0.6  # dense bfloat16 peak, 60% reached
GPU_BYTES = 80e9 * 0.9  # gpu_memory_utilization 0.9

SHAPES = {  # Llama-3 (and 3.1/3.3, same shapes)
    "llama-3-8b": dict(hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256),
    "llama-3-70b": dict(hidden=8192, layers=80, heads=64, kv_heads=8, head_dim=128, intermediate=28672, vocab=128256),
}


def params(s: dict) -> float:
    attn = s["hidden"] * s["head_dim"] * (2 * s["heads"] + 2 * s["kv_heads"])
    mlp = 3 * s["hidden"] * s["intermediate"]
    return s["layers"] * (attn + mlp) + 2 * s["vocab"] * s["hidden"]


def collectives_s(s: dict, n: int, tokens: int, sampled: int) -> float:
    if n == 1:
        return 0.0
    bw = LINK_BYTES_S * LINK_EFFICIENCY
    reduce_bytes = tokens * s["hidden"] * 2
    reduces = (2 * s["layers"] + 1) * (COLLECTIVE_LATENCY_S + 2 * (n - 1) / n * reduce_bytes / bw)
    gather = COLLECTIVE_LATENCY_S + (n - 1) / n * sampled * s["vocab"] * 2 / bw
    return reduces + gather


def step(s: dict, n: int, tokens: int, sampled: int, context: int) -> dict:
    """One step of ``tokens`` new tokens (``sampled`` of them sample) over ``context`` cached tokens in all."""
    weights = 2 * params(s)
    kv_per_token = 2 * s["layers"] * s["kv_heads"] * s["head_dim"] * 2
    compute = 2 * params(s) * tokens / n / FLOPS
    memory = (weights + context * kv_per_token) / n / HBM_BYTES_S
    comm = collectives_s(s, n, tokens, sampled)
    total = max(compute, memory) + comm
    return {"compute_ms": 1e3 * compute, "memory_ms": 1e3 * memory, "collectives_ms": 1e3 * comm,
            "step_ms": 1e3 * total, "collective_share": comm / total, "tokens_s": tokens / total,
            "tokens_s_per_gpu": tokens / total / n}


def table(name: str, s: dict, n: int) -> dict:
    weights_gpu = 2 * params(s) / n
    kv_token_gpu = 2 * s["layers"] * s["kv_heads"] * s["head_dim"] * 2 / n
    kv_tokens = max(0.0, GPU_BYTES - weights_gpu - 2e9) / kv_token_gpu  # 2 GB of activations, assumed
    decode_batch, context = 256, 1024
    row = {"model": name, "gpus": n, "weights_gb_per_gpu": weights_gpu / 1e9, "kv_tokens_fit": int(kv_tokens),
           "fits": kv_tokens >= decode_batch * context}
    row["decode_256x1024"] = step(s, n, decode_batch, decode_batch, decode_batch * context)
    row["decode_32x1024"] = step(s, n, 32, 32, 32 * context)
    row["prefill_8192"] = step(s, n, 8192, 4, 8192 // 2)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = [table(name, s, n) for name, s in SHAPES.items() for n in (1, 2, 4, 8)]
    for r in rows:
        d, p = r["decode_256x1024"], r["prefill_8192"]
        print(f"{r['model']:12} N={r['gpus']} weights/GPU {r['weights_gb_per_gpu']:6.1f} GB  fits={r['fits']!s:5} "
              f"decode256 {d['step_ms']:6.2f} ms (collectives {d['collectives_ms']:5.2f}, {d['collective_share']:4.0%}) "
              f"{d['tokens_s']:7.0f} tok/s {d['tokens_s_per_gpu']:6.0f}/GPU | prefill8192 {p['step_ms']:7.1f} ms "
              f"(collectives {p['collective_share']:4.0%}) {p['tokens_s_per_gpu']:6.0f} tok/s/GPU")
    assumptions = {"link_bytes_s_per_direction": LINK_BYTES_S, "link_efficiency": LINK_EFFICIENCY,
                   "collective_latency_s": COLLECTIVE_LATENCY_S, "hbm_bytes_s": HBM_BYTES_S, "flops": FLOPS,
                   "gpu_bytes_usable": GPU_BYTES, "note": "a model from shapes and datasheet figures, not measured"}
    if args.out:
        args.out.write_text(json.dumps({"command": "python bench/tp_cost_model.py --out " + str(args.out),
                                        "assumptions": assumptions, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
