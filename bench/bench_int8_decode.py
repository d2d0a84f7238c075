"""The engine on SmolLM2-135M's W8A8 copy (tests/quant_checkpoints.py, int8, written once under the
cache as bench/bench_quantized.py writes it) against its bfloat16 self: decode of a few sequences
and, with ``--uniform N``, a batch of N prompts x (338 + 96). Three engines in one process,
alternating run by run (order reversed every round): ``bfloat16``, ``int8_old`` (every
Int8Linear's forward put back to the pre-kernel one of bench/probe_int8.py) and ``int8_new``.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_int8_decode.py --out bench/published
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from probe_int8 import old_int8  # noqa: E402
from quant_checkpoints import write_quantized  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402
from engine.cpu_info import cpu_flags  # noqa: E402
from engine.model_registry import DEFAULT_MODEL, cache_dir, resolve_model  # noqa: E402
from engine.quant import int8_kernel  # noqa: E402
from engine.quant.linear import Int8Linear, exact_int8_gemm  # noqa: E402


def engines(blocks: int, threads: int | None) -> dict[str, LLM]:
    src = resolve_model(DEFAULT_MODEL)
    folder = cache_dir() / "quantized" / f"{DEFAULT_MODEL}-int8-g64"
    if not (folder / "config.json").is_file():
        write_quantized(src, folder, "int8", 64)
    out = {name: LLM(str(path), dtype="bfloat16", num_kv_blocks=blocks, num_threads=threads)
           for name, path in (("bfloat16", src), ("int8_old", folder), ("int8_new", folder))}
    old = [m for m in out["int8_old"].engine.runner.model.modules() if isinstance(m, Int8Linear)]
    assert old and all(m.bias is None for m in old)  # old_int8 adds no bias
    for m in old:
        m.forward = old_int8(m)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="2,4")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--uniform", type=int, default=0, help="also N prompts x (338 + 96)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (1: no OpenMP barrier stalls on a shared machine)")
    ap.add_argument("--out", default="bench/published")
    args = ap.parse_args()
    rng = random.Random(0)
    cases = {f"decode_{n}x{args.tokens}": ([[rng.randrange(3, 49152) for _ in range(64)] for _ in range(n)], args.tokens)
             for n in map(int, args.seqs.split(","))}
    if args.uniform:
        cases[f"uniform_{args.uniform}x(338+96)"] = (
            [[rng.randrange(3, 49152) for _ in range(338)] for _ in range(args.uniform)], 96)
    blocks = max(len(p) * -(-(len(p[0]) + t) // 16) for p, t in cases.values()) + 64
    llms = engines(blocks, args.threads)
    for llm in llms.values():
        llm.generate(cases[next(iter(cases))][0], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    secs: dict = {c: {n: [] for n in llms} for c in cases}
    out = Path(args.out) / f"int8-decode-{time.strftime('%Y%m%d-%H%M%S')}.json"
    result = {"command": " ".join(sys.argv), "cpu_flags": sorted(cpu_flags()), "int8_int_mm": exact_int8_gemm(),
              "kernel_isa": int8_kernel.isa(int8_kernel.library()), "kernel_max_rows": int8_kernel.max_rows(exact_int8_gemm()),
              "threads": args.threads,
              "seconds": secs}
    for r in range(args.rounds):
        for name in list(llms) if r % 2 == 0 else list(llms)[::-1]:
            for case, (prompts, tokens) in cases.items():
                t = time.perf_counter()
                llms[name].generate(prompts, SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))
                secs[case][name].append(round(time.perf_counter() - t, 3))
                print(r, name, case, secs[case][name][-1], flush=True)
        result["rounds_done"] = r + 1
        result["summary"] = {
            case: {name: {"median_s": statistics.median(v), "out_tok_s": round(len(cases[case][0]) * cases[case][1] / statistics.median(v), 1),
                          "vs_bfloat16": round(statistics.median(per["bfloat16"]) / statistics.median(v), 3)}
                   for name, v in per.items()} for case, per in secs.items()}
        out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1), "->", out)


if __name__ == "__main__":
    main()
