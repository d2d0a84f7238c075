"""Prefill attention on this CPU: SDPA per chunk (the backend's path with AMX) against the C
prefill kernel (``engine/attention/cpu_paged_prefill.c``), keys read in place.

One chunk of ``m`` prompt tokens after ``ctx`` cached ones, SmolLM2's heads (9 query, 3 KV,
head_dim 64), blocks shuffled across a 4,000-block pool. Medians of 7 alternating runs.

    PYTHONPATH=$PWD .venv/bin/python bench/probe_prefill_attention.py --out bench/published
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench import sysinfo
from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import TorchAttentionBackend

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16
CASES = [(0, 230), (0, 1000), (0, 2000), (700, 100), (2000, 2000), (6000, 2000)]


def chunk(ctx: int, m: int, dtype: torch.dtype):
    pool = 4000
    k_cache = torch.randn(KV_HEADS, pool, BLOCK, HEAD_DIM).to(dtype)
    v_cache = torch.randn(KV_HEADS, pool, BLOCK, HEAD_DIM).to(dtype)
    seq = ctx + m
    table = torch.randperm(pool)[: -(-seq // BLOCK)].to(torch.int32)[None]
    slots = torch.tensor([int(table[0, p // BLOCK]) * BLOCK + p % BLOCK for p in range(ctx, seq)])
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, m], dtype=torch.int32), seq_lens=torch.tensor([seq], dtype=torch.int32),
        context_lens=torch.tensor([ctx], dtype=torch.int32), slot_mapping=slots, block_tables=table,
        block_size=BLOCK, num_decodes=0, max_query_len=m, max_seq_len=seq, query_lens_host=[m],
        seq_lens_host=[seq], context_lens_host=[ctx])
    qkv = torch.randn(m, (HEADS + 2 * KV_HEADS) * HEAD_DIM).to(dtype)
    q = qkv[:, : HEADS * HEAD_DIM].view(m, HEADS, HEAD_DIM)
    k = qkv[:, HEADS * HEAD_DIM: (HEADS + KV_HEADS) * HEAD_DIM].view(m, KV_HEADS, HEAD_DIM)
    v = qkv[:, (HEADS + KV_HEADS) * HEAD_DIM:].view(m, KV_HEADS, HEAD_DIM)
    return q, k, v, k_cache, v_cache, meta


def measure(ctx: int, m: int, dtype: torch.dtype) -> dict:
    q, k, v, k_cache, v_cache, meta = chunk(ctx, m, dtype)
    paths = {"sdpa": TorchAttentionBackend(prefill_kernel=False), "kernel": TorchAttentionBackend()}
    paths["sdpa"].write_kv(k, v, k_cache, v_cache, meta)
    outs = {name: b.attend(q, k, v, k_cache, v_cache, meta, 0.125) for name, b in paths.items()}
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(7):
        for name, backend in paths.items():
            t = time.perf_counter()
            backend.attend(q, k, v, k_cache, v_cache, meta, 0.125)
            times[name].append((time.perf_counter() - t) * 1e3)
    rec = {"dtype": str(dtype).removeprefix("torch."), "context": ctx, "chunk": m,
           "kernel_used": paths["kernel"]._prefill_in_kernel(q, k_cache),
           "max_abs_diff": float((outs["sdpa"].float() - outs["kernel"].float()).abs().max()),
           **{f"{name}_ms": round(statistics.median(t), 3) for name, t in times.items()}}
    print(f"{rec['dtype']:9s} ctx {ctx:5d} chunk {m:5d}: SDPA {rec['sdpa_ms']:8.3f} ms  kernel "
          f"{rec['kernel_ms']:8.3f} ms  ({rec['sdpa_ms'] / rec['kernel_ms']:.2f}x; max diff {rec['max_abs_diff']:.1e})",
          flush=True)
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="directory for the JSON")
    args = ap.parse_args()
    info = sysinfo.cpu_info()
    print(sysinfo.describe(info))
    torch.manual_seed(0)
    rows = [measure(ctx, m, dtype) for dtype in (torch.bfloat16, torch.float32) for ctx, m in CASES]
    if args.out:
        sysinfo.write_result(args.out, "probe-prefill-attention", {"info": info, "load": sysinfo.load(), "cases": rows})


if __name__ == "__main__":
    main()
