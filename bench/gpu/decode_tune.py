"""Decode attention on one GPU: the Triton decode kernel's tile and launch shape and its split-K
policy, timed on the decode steps of the 1,024-request summarisation job (bench/gpu/summ-1024.json).

    PYTHONPATH=$PWD python bench/gpu/decode_tune.py --out $OUT/decode-tune.json --launch-out $OUT/decode-launch.json

The job admits every request at once, so at decode step t the requests whose budget exceeds t
are alive with contexts prompt + t. For each batch size n in SIZES the step where n are left
is one shape (Llama-3.2-1B's attention: 32 query heads over 8 KV heads of 64, bfloat16, blocks
of 16, shuffled block tables); each shape weighs the number of decode steps nearest to it.

1. Every (BLOCK_N, num_warps, num_stages) without splits on the large batches.
2. The best three at 1-16 splits on the small batches.
3. Split policies (target_programs, min_partition) as a CUDA graph applies them (its split count
   fixed for a 4,096-token context): per-job decode-attention milliseconds for each.
The kernel of the previous round (contiguous partitions, launched as its graphs did) is timed
beside it. The chosen launch goes to --launch-out for gpu_async.py --decode-launch.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from common import bench_ms, device_meta, tune_arguments  # noqa: E402

from engine.attention import triton_kernels as K  # noqa: E402
from engine.attention.triton_backend import DecodeLaunch, _dot_dtype  # noqa: E402

CUDA = torch.cuda.is_available()
SIZES = (1024, 512, 256, 128, 64, 32, 16, 8)
HEADS, KV_HEADS, HEAD_DIM, BLOCK, LAYERS, GRAPH_MAX_LEN = 32, 8, 64, 16, 16, 4096
LOG2E = 1.4426950408889634


@triton.jit
def old_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, part_acc_ptr, part_ml_ptr,
    qk_scale, partition_size, window,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_cs, stride_ch, stride_bt,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    """The decode kernel as of 52dcef0: one contiguous partition of the context per split."""
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    heads = kvh * GROUP + g
    g_mask = g < GROUP
    q = tl.load(q_ptr + seq.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + d[None, :],
                mask=g_mask[:, None], other=0.0).to(DOT_DTYPE)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    lo = tl.maximum(seq_len - window, 0)
    end = tl.minimum(split * partition_size + partition_size, seq_len)
    start = tl.maximum(split * partition_size, lo)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        valid = pos < end
        block = tl.load(table + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        row = block * stride_cb + (pos % BLOCK_SIZE) * stride_cs + kvh * stride_ch
        k = tl.load(k_cache_ptr + row[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(DOT_DTYPE)
        v = tl.load(v_cache_ptr + row[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(DOT_DTYPE)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        p_dot = p.to(k_cache_ptr.dtype.element_ty).to(DOT_DTYPE)
        acc = acc * alpha[:, None] + tl.dot(p_dot, v, input_precision="ieee")
        m_i = m_new
    if NUM_SPLITS == 1:
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        o = acc / l_safe[:, None]
        dst = out_ptr + seq.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + d[None, :]
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])
    else:
        num_heads = tl.num_programs(1) * GROUP
        base = (seq.to(tl.int64) * num_heads + heads) * NUM_SPLITS + split
        tl.store(part_acc_ptr + base[:, None] * HEAD_DIM + d[None, :], acc, mask=g_mask[:, None])
        tl.store(part_ml_ptr + base * 2, m_i, mask=g_mask)
        tl.store(part_ml_ptr + base * 2 + 1, l_i, mask=g_mask)


def job_shapes(workload: Path, small: bool) -> list[dict]:
    """Per batch size: the contexts of the decode step where that many requests are left, and
    how many of the job's decode steps are nearest to it (log scale)."""
    wl = json.loads(workload.read_text())
    prompts, budgets = [len(p) for p in wl["prompts"]], wl["max_tokens"]
    if small:
        prompts, budgets = [p // 8 for p in prompts[:64]], [b // 8 + 2 for b in budgets[:64]]
    order = sorted(range(len(budgets)), key=lambda i: -budgets[i])
    sizes = [n for n in SIZES if n <= len(budgets)] if not small else [64, 16, 8]
    weights = dict.fromkeys(sizes, 0)
    for t in range(1, max(budgets)):
        alive = sum(b > t for b in budgets)
        if alive:
            weights[min(sizes, key=lambda n: abs(math.log2(n) - math.log2(alive)))] += 1
    shapes = []
    for n in sizes:
        t = max(budgets[order[n - 1]] - 1, 1)
        lens = [prompts[i] + t for i in order[:n]]
        shapes.append({"n": n, "step": t, "weight_steps": weights[n], "lens": lens,
                       "mean_len": round(sum(lens) / n, 1), "max_len": max(lens)})
    return shapes


class Shape:
    """A decode step's tensors on the device: queries, block tables and seq_lens over one pool."""

    def __init__(self, spec: dict, pool: tuple[torch.Tensor, torch.Tensor], gen: torch.Generator, dev: str):
        self.spec, self.n = spec, spec["n"]
        lens = spec["lens"]
        width = -(-max(lens) // BLOCK)
        blocks = pool[0].shape[0]
        need = sum(-(-x // BLOCK) for x in lens)
        ids = torch.randperm(blocks, generator=gen)[:need]
        table = torch.zeros(self.n, width, dtype=torch.int32)
        at = 0
        for i, x in enumerate(lens):
            nb = -(-x // BLOCK)
            table[i, :nb] = ids[at: at + nb]
            at += nb
        self.table = table.to(dev)
        self.seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
        self.q = torch.randn(self.n, HEADS, HEAD_DIM, generator=gen).to(pool[0].dtype).to(dev)
        self.out = torch.empty_like(self.q)
        self.kv_bytes = 2 * sum(lens) * KV_HEADS * HEAD_DIM * pool[0].element_size()


def launch(shape: Shape, pool, cfg: DecodeLaunch, splits: int, old: bool = False, head_major: bool = False):
    """One decode-attention call (plus the split reduction) as a closure; scratch made up front."""
    k_cache, v_cache = pool
    n = shape.n
    if head_major:  # [blocks, kv_heads, block, dim]: a head's block is 2 KB contiguous
        s_cb, s_ch, s_cs = k_cache.stride(0), k_cache.stride(1), k_cache.stride(2)
    else:
        s_cb, s_cs, s_ch = k_cache.stride(0), k_cache.stride(1), k_cache.stride(2)
    acc = torch.empty(n, HEADS, splits, HEAD_DIM, dtype=torch.float32, device=k_cache.device)
    ml = torch.empty(n, HEADS, splits, 2, dtype=torch.float32, device=k_cache.device)
    kernel = old_decode_kernel if old else K.decode_kernel
    lead = (HEAD_DIM**-0.5 * LOG2E,)
    if old:
        lead += (max(cfg.block_n, -(-GRAPH_MAX_LEN // (splits * cfg.block_n)) * cfg.block_n) if splits > 1 else GRAPH_MAX_LEN,)
    q, out = shape.q, shape.out

    def run():
        kernel[(n, KV_HEADS, splits)](
            q, k_cache, v_cache, shape.table, shape.seq_lens, out, acc, ml, *lead, 1 << 30,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1), s_cb, s_cs, s_ch, shape.table.stride(0),
            GROUP=HEADS // KV_HEADS, GROUP_PAD=16, HEAD_DIM=HEAD_DIM, BLOCK_SIZE=BLOCK, BLOCK_N=cfg.block_n,
            NUM_SPLITS=splits, DOT_DTYPE=_dot_dtype(kernel, q.dtype), num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        if splits > 1:
            K.reduce_splits_kernel[(n, HEADS)](acc, ml, out, out.stride(0), out.stride(1), NUM_SPLITS=splits,
                                               SPLITS_PAD=triton.next_power_of_2(splits), HEAD_DIM=HEAD_DIM, num_warps=1)
        return out

    return run


def reference(shape: Shape, pool, head_major: bool = False) -> torch.Tensor:
    """float32 attention of each decode over its context, gathered with torch."""
    k_cache, v_cache = pool
    outs = []
    for i, x in enumerate(shape.spec["lens"]):
        blocks = shape.table[i, : -(-x // BLOCK)].long()
        k, v = k_cache[blocks], v_cache[blocks]
        if head_major:
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        k, v = (t.reshape(-1, KV_HEADS, HEAD_DIM)[:x].float().repeat_interleave(HEADS // KV_HEADS, 1) for t in (k, v))
        s = torch.einsum("hd,thd->ht", shape.q[i].float(), k) * HEAD_DIM**-0.5
        outs.append(torch.einsum("ht,thd->hd", s.softmax(-1), v))
    return torch.stack(outs)


def graph_splits(n: int, target: int, min_partition: int, max_splits: int = 32) -> int:
    """The split count TritonAttentionBackend._num_splits gives a graph captured for GRAPH_MAX_LEN."""
    return max(1, min(-(-GRAPH_MAX_LEN // min_partition), -(-target // (n * KV_HEADS)), max_splits))


def main() -> None:
    args = tune_arguments()
    dev = "cuda" if CUDA else "cpu"
    t0 = time.perf_counter()
    specs = job_shapes(args.workload, args.small)
    gen = torch.Generator().manual_seed(0)
    blocks = sum(-(-x // BLOCK) for x in specs[0]["lens"]) + 64
    token_major = tuple(torch.randn(blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=gen).bfloat16().to(dev) for _ in range(2))
    head_major = tuple(p.transpose(1, 2).contiguous() for p in token_major)
    shapes = {s["n"]: Shape(s, token_major, gen, dev) for s in specs}
    res: dict = device_meta() | {"script": "bench/gpu/decode_tune.py", "argv": sys.argv[1:], "shapes": [
        {k: v for k, v in s.items() if k != "lens"} | {"kv_mb": round(shapes[s["n"]].kv_bytes / 1e6, 2)} for s in specs]}
    bw = {s["n"]: shapes[s["n"]].kv_bytes / 1e9 for s in specs}  # GB per call
    weights = {s["n"]: s["weight_steps"] for s in specs}
    errors: dict[str, float] = {}

    def timed(name: str, n: int, fn, check: torch.Tensor | None = None) -> float | None:
        try:
            got = fn()
            if check is not None:
                err = (got.float() - check).abs().max().item()
                errors[name] = round(err, 4)
                if not err < 3e-2:
                    print(f"  {name}: WRONG (max error {err:.3g})", flush=True)
                    return None
            return bench_ms(fn)
        except Exception as exc:  # a tile that does not fit (shared memory) is skipped, not fatal
            print(f"  {name}: failed {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            return None

    refs = {n: reference(shapes[n], token_major) for n in shapes if n <= 64 or not CUDA}
    base = DecodeLaunch()  # the previous round's tile, warps, stages and policy
    for n in shapes:  # large batches: checked against the old kernel, itself checked on the small ones
        if n not in refs:
            refs[n] = launch(shapes[n], token_major, base, 1, old=True)().float().clone()
    old_ms = {}
    for n, shape in shapes.items():
        s = graph_splits(n, base.target_programs, base.min_partition)
        old_ms[n] = timed(f"old/{n}/s{s}", n, launch(shape, token_major, base, s, old=True), refs.get(n))
    res["old_kernel_graph_policy_ms"] = old_ms
    print(f"old kernel: {old_ms}  ({time.perf_counter() - t0:.0f}s)", flush=True)

    # 1. tile and launch shape, no splits, on the large batches
    big = [n for n in shapes if n >= 128] or list(shapes)[:1]
    grid = ([(bn, w, st) for bn, w, st in itertools.product((32, 64, 128), (2, 4, 8), (1, 2, 3, 4))]
            if CUDA else [(16, 4, 3), (32, 4, 3)])
    phase1 = {}
    for bn, w, st in grid:
        cfg = DecodeLaunch(block_n=bn, num_warps=w, num_stages=st, min_partition=max(bn, 512))
        row = {n: timed(f"p1/{bn}x{w}x{st}/{n}", n, launch(shapes[n], token_major, cfg, 1), refs.get(n)) for n in big}
        if all(v is not None for v in row.values()):
            phase1[(bn, w, st)] = row
            print(f"  BLOCK_N {bn:3d} warps {w} stages {st}: " + "  ".join(
                f"n={n} {ms * 1e3:6.1f}us {bw[n] / ms:5.2f}TB/s" for n, ms in row.items()), flush=True)
    score = {c: sum(weights[n] * ms for n, ms in row.items()) for c, row in phase1.items()}
    top = sorted(score, key=score.get)[:3]
    res["phase1_us"] = {f"{bn}x{w}x{st}": {n: round(ms * 1e3, 2) for n, ms in row.items()} for (bn, w, st), row in phase1.items()}
    res["phase1_top"] = [f"{bn}x{w}x{st}" for bn, w, st in top]
    print(f"phase 1 top: {res['phase1_top']}  ({time.perf_counter() - t0:.0f}s)", flush=True)

    # 2. splits on the small batches, for the best three
    splits_set = (1, 2, 4, 8, 16) if CUDA else (1, 2, 4)
    phase2: dict = {}
    for bn, w, st in top:
        cfg = DecodeLaunch(block_n=bn, num_warps=w, num_stages=st, min_partition=max(bn, 512))
        for n in shapes:
            for s in splits_set:
                ms = timed(f"p2/{bn}x{w}x{st}/{n}/s{s}", n, launch(shapes[n], token_major, cfg, s), refs.get(n))
                if ms is not None:
                    phase2[(bn, w, st, n, s)] = ms
        print(f"  {bn}x{w}x{st}: " + "  ".join(
            f"n={n} " + "/".join(f"{phase2.get((bn, w, st, n, s), float('nan')) * 1e3:.0f}" for s in splits_set)
            for n in shapes) + " us at splits " + "/".join(map(str, splits_set)), flush=True)
    res["phase2_us"] = {f"{bn}x{w}x{st}/n{n}/s{s}": round(ms * 1e3, 2) for (bn, w, st, n, s), ms in phase2.items()}

    # 3. split policies as a graph applies them: decode-attention ms over the job's decode steps
    policies = {}
    for (bn, w, st), target, minp in itertools.product(top, (512, 1024, 2048, 4096, 8192), (128, 256, 512)):
        if minp % bn:
            continue
        per = {n: phase2.get((bn, w, st, n, graph_splits(n, target, minp, max(splits_set)))) for n in shapes}
        if all(v is not None for v in per.values()):
            policies[(bn, w, st, target, minp)] = sum(weights[n] * ms for n, ms in per.items()) * LAYERS
    best = min(policies, key=policies.get)
    job_old = sum(weights[n] * ms for n, ms in old_ms.items() if ms is not None) * LAYERS
    res["policies_job_ms"] = {"x".join(map(str, k)): round(v, 2) for k, v in sorted(policies.items(), key=lambda kv: kv[1])[:20]}
    res["job_decode_attention_ms"] = {"old": round(job_old, 2), "best": round(policies[best], 2),
                                      "old_over_best": round(job_old / policies[best], 3)}
    bn, w, st, target, minp = best
    chosen = DecodeLaunch(block_n=bn, num_warps=w, num_stages=st, target_programs=target, min_partition=minp,
                          max_splits=max(splits_set))
    res["chosen"] = chosen.__dict__

    # 4. the chosen launch on a head-major pool (each head's block contiguous), for the record
    hm = {}
    for n, shape in shapes.items():
        s = graph_splits(n, target, minp, max(splits_set))
        hm_shape = Shape.__new__(Shape)
        hm_shape.__dict__ = dict(shape.__dict__)
        hm_ref = reference(shape, head_major, head_major=True) if n in refs else None
        hm[n] = timed(f"head-major/{n}", n, launch(hm_shape, head_major, chosen, s, head_major=True), hm_ref)
    res["head_major_chosen_us"] = {n: round(v * 1e3, 2) if v else None for n, v in hm.items()}
    res["chosen_us"] = {n: round(phase2[(bn, w, st, n, graph_splits(n, target, minp, max(splits_set)))] * 1e3, 2)
                        for n in shapes}
    res["old_us"] = {n: round(v * 1e3, 2) if v else None for n, v in old_ms.items()}
    res["chosen_tb_per_s"] = {n: round(bw[n] / (res["chosen_us"][n] / 1e3), 3) for n in shapes}
    res["max_errors"] = errors
    res["seconds"] = round(time.perf_counter() - t0, 1)
    args.out.write_text(json.dumps(res, indent=1, default=str))
    if args.launch_out:
        args.launch_out.write_text(json.dumps(chosen.__dict__))
    print(f"chosen {chosen}\n  us per call {res['chosen_us']}\n  old {res['old_us']}\n  head-major {res['head_major_chosen_us']}"
          f"\n  TB/s {res['chosen_tb_per_s']}\n  job decode attention ms {res['job_decode_attention_ms']}  ({res['seconds']}s)")


if __name__ == "__main__":
    main()
