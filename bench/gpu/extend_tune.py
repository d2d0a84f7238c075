"""Prefill attention on one GPU: the Triton extend kernel's tiles, warps and stages, timed on the prefill steps of the 1,024-request summarisation job (bench/gpu/summ-1024.json).

    PYTHONPATH=$PWD python bench/gpu/extend_tune.py --out $OUT/extend-tune.json --launch-out $OUT/extend-launch.json

The job's prefill steps are rebuilt as the scheduler makes them (``max_num_batched_tokens``
8,192, every request admitted at once): each step's decodes take one token each, the rest of
the budget goes to prompt chunks in order, and every prompt after the first finds the shared
system prefix's two full blocks cached. Three of those steps (the first, the middle, the last
with chunks) are the shapes; Llama-3.2-1B's attention (32 query heads over 8 KV heads of 64,
bfloat16, blocks of 16, shuffled block tables). Each launch's output is checked against the
current default's, which the CUDA tests check against torch.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_ms, device_meta, tune_arguments  # noqa: E402

from engine.attention.metadata import AttentionMetadata  # noqa: E402
from engine.attention.triton_backend import DEFAULT_EXTEND, ExtendLaunch, TritonAttentionBackend  # noqa: E402

CUDA = torch.cuda.is_available()
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 64, 16
BUDGET, CACHED = 8192, 32


def prefill_steps(prompts: list[int], budget: int) -> list[list[tuple[int, int]]]:
    """Per step with prompt chunks: ``(context, chunk)`` of each, in the order the scheduler packs them."""
    done: list[int] = [0] * len(prompts)  # prompt tokens computed (or found cached)
    steps, decoding, nxt = [], 0, 0
    while nxt < len(prompts) or any(d < p for d, p in zip(done, prompts, strict=True)):
        left, chunks, finished_now = budget - decoding, [], 0
        i = 0
        while left > 0 and i < len(prompts):
            if i >= nxt:
                if i > 0:
                    done[i] = min(CACHED, prompts[i] - 1)  # the shared prefix's full blocks
                nxt = i + 1
            if done[i] < prompts[i]:
                q = min(prompts[i] - done[i], left)
                chunks.append((done[i], q))
                done[i] += q
                left -= q
                finished_now += done[i] == prompts[i]
            i += 1
        if not chunks:
            break
        steps.append(chunks)
        decoding += finished_now
    return steps


def make_step(chunks: list[tuple[int, int]], gen: torch.Generator, dev: str):
    """Metadata, queries and a pool for one step of prompt chunks (no decodes)."""
    lens = [c + q for c, q in chunks]
    width = -(-max(lens) // BLOCK)
    need = sum(-(-x // BLOCK) for x in lens)
    pool = tuple(torch.randn(need + 8, BLOCK, KV_HEADS, HEAD_DIM, generator=gen).bfloat16().to(dev) for _ in range(2))
    ids = torch.randperm(need + 8, generator=gen)[:need]
    table = torch.zeros(len(chunks), width, dtype=torch.int32)
    at = 0
    for i, x in enumerate(lens):
        nb = -(-x // BLOCK)
        table[i, :nb] = ids[at: at + nb]
        at += nb
    q_lens = [q for _, q in chunks]
    qsl = torch.zeros(len(chunks) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(q_lens).cumsum(0)
    meta = AttentionMetadata(
        query_start_loc=qsl.to(dev), seq_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
        context_lens=torch.tensor([c for c, _ in chunks], dtype=torch.int32, device=dev),
        slot_mapping=torch.zeros(sum(q_lens), dtype=torch.int64, device=dev), block_tables=table.to(dev),
        block_size=BLOCK, num_decodes=0, max_query_len=max(q_lens), max_seq_len=max(lens),
        query_lens_host=q_lens, seq_lens_host=lens, context_lens_host=[c for c, _ in chunks])
    q = torch.randn(sum(q_lens), HEADS, HEAD_DIM, generator=gen).bfloat16().to(dev)
    return meta, pool, q


def main() -> None:
    args = tune_arguments()
    dev = "cuda" if CUDA else "cpu"
    t0 = time.perf_counter()
    wl = json.loads(args.workload.read_text())
    prompts = [len(p) for p in wl["prompts"]]
    budget = BUDGET
    if args.small:
        prompts, budget = [p // 8 for p in prompts[:48]], 512
    steps = prefill_steps(prompts, budget)
    picks = sorted({0, len(steps) // 2, len(steps) - 1})
    gen = torch.Generator().manual_seed(0)
    shapes = {i: make_step(steps[i], gen, dev) for i in picks}
    res: dict = device_meta() | {"script": "bench/gpu/extend_tune.py", "argv": sys.argv[1:],
                                 "prefill_steps": len(steps), "shapes": {
        str(i): {"chunks": len(steps[i]), "tokens": sum(q for _, q in steps[i]),
                 "mean_context": round(sum(c for c, _ in steps[i]) / len(steps[i]), 1)} for i in picks}}
    scale = HEAD_DIM**-0.5

    def runner(launch: ExtendLaunch, i: int):
        meta, (kc, vc), q = shapes[i]
        backend = TritonAttentionBackend(extend=launch)
        return lambda: backend.attend(q, q[:, :KV_HEADS], q[:, :KV_HEADS], kc, vc, meta, scale)

    refs = {i: runner(DEFAULT_EXTEND, i)().float() for i in picks}
    if args.small:
        grid = [ExtendLaunch(64, 64, 4, 3), ExtendLaunch(32, 16, 4, 2)]
    else:
        grid = [ExtendLaunch(bm, bn, w, st) for bm, bn, w, st in itertools.product(
            (64, 128), (32, 64, 128), (4, 8), (2, 3))]
    table: dict[str, dict[str, float]] = {}
    errors: dict[str, float] = {}
    for launch in grid:
        name = f"{launch.block_m}x{launch.block_n}x{launch.num_warps}x{launch.num_stages}"
        try:
            per = {}
            for i in picks:
                fn = runner(launch, i)
                err = (fn().float() - refs[i]).abs().max().item()
                errors[f"{name}/{i}"] = round(err, 4)
                if not err < 3e-2:
                    raise ValueError(f"max error {err:.3g} on step {i}")
                per[str(i)] = round(1e3 * bench_ms(fn), 2)
            table[name] = per
            print(f"  {name}: {per}", flush=True)
        except Exception as exc:  # a tile that does not fit shared memory is skipped, not fatal
            print(f"  {name}: failed {type(exc).__name__}: {str(exc)[:120]}", flush=True)
    default = f"{DEFAULT_EXTEND.block_m}x{DEFAULT_EXTEND.block_n}x{DEFAULT_EXTEND.num_warps}x{DEFAULT_EXTEND.num_stages}"
    total = {k: sum(v.values()) for k, v in table.items()}
    best = min(total, key=total.get)
    chosen = next(x for x in grid if best == f"{x.block_m}x{x.block_n}x{x.num_warps}x{x.num_stages}")
    per_step = len(steps) / len(picks)  # each pick stands for this many prefill steps, 16 layers each
    res |= {"us": table, "max_errors": errors, "default": default, "best": best, "chosen": chosen.__dict__,
            "default_us_sum": total.get(default), "best_us_sum": total[best],
            "job_extend_ms_default": round(total.get(default, 0) * per_step * 16 / 1e3, 1),
            "job_extend_ms_best": round(total[best] * per_step * 16 / 1e3, 1),
            "seconds": round(time.perf_counter() - t0, 1)}
    print(f"default {default} {total.get(default)} us, best {best} {total[best]} us "
          f"(job: {res['job_extend_ms_default']} -> {res['job_extend_ms_best']} ms)", flush=True)
    args.out.write_text(json.dumps(res, indent=1))
    if args.launch_out:
        args.launch_out.write_text(json.dumps(chosen.__dict__))


if __name__ == "__main__":
    main()
