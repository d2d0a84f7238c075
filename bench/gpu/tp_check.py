"""Tensor parallelism on a multi-GPU machine: greedy equality of 1 and N ranks, the all-reduce's
cost at the engine's buffer sizes, and a job's time on 1 and N GPUs.

    PYTHONPATH=$PWD python bench/gpu/tp_check.py --out $OUT/tp-check.json [--ranks 2] [--shape 8b]

With one GPU only the ``one-rank-group`` section runs: the NCCL group, the sharded modules and
the step messages on CUDA with a group of one, against the plain engine. ``--device cpu --quick``
is a dry run of the script itself (two gloo ranks, tiny sizes). Every section runs even when an
earlier one fails; results land in the JSON after each section.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import LLAMA_1B, LLAMA_8B, MID, TINY, Recorder, build_model, device_meta, free, random_prompts  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402

GREEDY = SamplingParams(max_tokens=32, temperature=0)


def tokens(llm: LLM, prompts, params=GREEDY) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, params)]


def equality(model_dir: Path, ranks: int, device: str, dtype: str, prompts) -> dict:
    settings = dict(device=device, dtype=dtype, num_kv_blocks=512, max_num_seqs=16)
    one = tokens(LLM(str(model_dir), **settings), prompts)
    free()
    llm = LLM(str(model_dir), tensor_parallel_size=ranks, **settings)
    try:
        many = tokens(llm, prompts)
    finally:
        llm.close()
    same = sum(a == b for a, b in zip(one, many, strict=True))
    return {"ranks": ranks, "dtype": dtype, "prompts": len(prompts), "identical": same}


def one_rank_group(model_dir: Path, device: str, prompts) -> dict:
    """The tensor-parallel path with a group of one (what a one-GPU machine can check)."""
    from engine.parallel.driver import TensorParallel

    settings = dict(device=device, dtype="bfloat16", num_kv_blocks=512, max_num_seqs=16)
    plain = tokens(LLM(str(model_dir), **settings), prompts)
    llm = LLM(str(model_dir), **settings)
    engine = llm.engine
    parallel = TensorParallel(dataclasses.replace(engine.config, tensor_parallel_size=1), engine.model_dir,
                              engine.max_model_len, device)
    engine.runner = parallel.runner
    try:
        grouped = tokens(llm, prompts)
    finally:
        parallel.close()
    return {"prompts": len(prompts), "identical": sum(a == b for a, b in zip(plain, grouped, strict=True))}


def _allreduce_rank(rank: int, size: int, port: int, device: str, out) -> None:
    from engine.parallel.group import init_group

    group = init_group(rank, size, port, device)
    results = []
    for hidden in (4096, 8192):
        for rows in (1, 32, 256, 2048, 8192):
            x = torch.ones(rows, hidden, dtype=torch.bfloat16, device=group.device)
            times = []
            for i in range(25):
                if group.device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                group.all_reduce(x)
                if group.device.type == "cuda":
                    torch.cuda.synchronize()
                if i >= 5:
                    times.append(time.perf_counter() - start)
            results.append({"hidden": hidden, "rows": rows, "bytes": x.numel() * 2,
                            "median_us": 1e6 * statistics.median(times)})
    if rank == 0:
        out.put(results)
    torch.distributed.destroy_process_group()


def allreduce(ranks: int, device: str) -> list[dict]:
    import torch.multiprocessing as mp

    from engine.parallel.group import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_allreduce_rank, args=(r, ranks, port, device, queue)) for r in range(ranks)]
    for p in procs:
        p.start()
    results = queue.get(timeout=300)
    for p in procs:
        p.join(timeout=60)
    return results


def job_time(model_dir: Path, ranks: int, device: str, vocab: int, requests: int, new_tokens: int) -> dict:
    prompts = random_prompts(requests, seed=1, vocab=vocab)
    llm = LLM(str(model_dir), device=device, dtype="bfloat16", tensor_parallel_size=ranks)
    try:
        llm.generate(prompts[:8], SamplingParams(max_tokens=4, temperature=0))  # warm-up
        start = time.perf_counter()
        outs = llm.generate(prompts, SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True))
        seconds = time.perf_counter() - start
    finally:
        llm.close()
    generated = sum(len(o.token_ids) for o in outs)
    return {"ranks": ranks, "requests": requests, "seconds": seconds, "generated_tokens": generated,
            "tokens_s": generated / seconds, "tokens_s_per_gpu": generated / seconds / ranks}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ranks", type=int, default=None, help="default: every visible GPU")
    ap.add_argument("--shape", choices=("1b", "8b"), default="1b", help="the timed job's model shape")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a dry run on the CPU)")
    args = ap.parse_args()
    gpus = torch.cuda.device_count() if args.device == "cuda" else 2
    ranks = args.ranks or gpus
    rec = Recorder(args.out, device_meta() | {"gpus": gpus, "ranks": ranks, "argv": sys.argv})
    tmp = Path(tempfile.mkdtemp())
    small = TINY if args.quick else MID
    build_dev = "cpu" if args.quick else args.device
    small_dir = build_model(tmp / "small", build_dev, **small)
    prompts = random_prompts(8, seed=2, vocab=small["vocab_size"])
    if args.device == "cuda":
        rec.run("one-rank-group", lambda: one_rank_group(small_dir, args.device, prompts))
    if ranks < 2:
        print("one GPU: the multi-rank sections need two or more")
        return
    for dtype in ("float32", "bfloat16"):
        rec.run(f"equality-{dtype}", lambda d=dtype: equality(small_dir, ranks, args.device, d, prompts))
    rec.run("allreduce", lambda: allreduce(ranks, args.device))
    shape = TINY if args.quick else (LLAMA_8B if args.shape == "8b" else LLAMA_1B)
    big = build_model(tmp / args.shape, build_dev, dtype=torch.bfloat16, **shape)
    requests, new_tokens = (16, 8) if args.quick else (512, 128)
    for n in (1, ranks):
        rec.run(f"job-{args.shape}-{n}-ranks",
                lambda n=n: job_time(big, n, args.device, shape["vocab_size"], requests, new_tokens))
        free()


if __name__ == "__main__":
    main()
