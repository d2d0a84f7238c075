"""The C int4 kernel (engine/native/int4_rows.c) against the float products, in two short runs.

``probe``: microseconds per product on SmolLM2-135M's four linear shapes (qkv 960x576, o 576x576,
gate_up 3072x576, down 576x1536) at 1-64 rows: the engine's float32 and bfloat16 ``Linear``
(packed as ``pack_linears`` packs them), torch's int4 kernel (bfloat16 rows, bfloat16 scales),
the C kernel on float32 and on bfloat16 rows, and the many-row path of ``Int4Linear`` (the weight
written out in float32 by the C kernel, then MKL) with the write alone. Methods alternate, order
reversed every round; medians.

``decode``: the packaged default model (Q4_1 GGUF), float32 dequantised vs as stored, and
bfloat16 dequantised / as stored for reference: seconds for 1, 2, 4 sequences x ``--out-len``
tokens and ``--large`` sequences x ``--large-out-len`` (16-token random prompts, EOS ignored),
variants alternating, order reversed every round; the JSON is rewritten after every round.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_int4.py probe --out bench/published
    PYTHONPATH=$PWD .venv/bin/python bench/bench_int4.py decode --out bench/published
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sysinfo import cpu_info  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402
from engine.cpu_info import cpu_flags  # noqa: E402
from engine.model_registry import DEFAULT_MODEL  # noqa: E402
from engine.models.linear import Linear  # noqa: E402
from engine.quant.checkpoint import QuantWeight  # noqa: E402
from engine.quant.int4_kernel import int4_kernel  # noqa: E402
from engine.quant.linear import Int4Linear  # noqa: E402

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}  # (out, in)
FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8")


def q4_1_weight(out: int, cols: int, seed: int) -> QuantWeight:
    g = torch.Generator().manual_seed(seed)
    groups = (out, cols // 32)
    return QuantWeight(torch.randint(-8, 8, (out, cols), dtype=torch.int8, generator=g),
                       (torch.rand(groups, generator=g) * 0.02).half().float(), torch.full(groups, -8, dtype=torch.int8),
                       32, (torch.rand(groups, generator=g) * 0.1 - 0.05).half().float())


def methods(qw: QuantWeight) -> dict:
    """name -> (f, the dtype of the rows it takes): each product as the engine would run it."""
    out, cols = qw.values.shape
    kernel = int4_kernel()
    w = qw.dequantize()
    lin32, lin16 = Linear(cols, out, bias=False), Linear(cols, out, bias=False).bfloat16()
    with torch.no_grad():
        lin32.weight.copy_(w)
        lin16.weight.copy_(w)
    lin32.pack()
    lin16.pack()
    torch_packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu((qw.values.int() + 8).contiguous(), 1)
    sz = torch.stack([qw.scale.t(), qw.offset.t()], dim=-1).bfloat16().contiguous()
    f32, b16 = torch.float32, torch.bfloat16
    found = {"float32 Linear": (lin32, f32), "bfloat16 Linear": (lin16, b16),
             "torch int4 kernel (bf16 rows)": (lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(
                 x, torch_packed, 32, sz), b16)}
    if kernel is not None:
        packed, csz = kernel.pack(qw)
        found |= {"C int4 kernel, float32 rows": (lambda x: kernel.product(x, packed, csz, out), f32),
                  "C int4 kernel, bfloat16 rows": (lambda x: kernel.product(x, packed, csz, out), b16),
                  "C float32 weight write + MKL": (
                      lambda x: torch.nn.functional.linear(x, kernel.dequantize(packed, csz)), f32),
                  "C float32 weight write alone": (lambda x: kernel.dequantize(packed, csz), f32)}
    return found


def probe(args) -> dict:
    result = {}
    for rows in args.rows:
        per = {}
        for shape, (out, cols) in SHAPES.items():
            found = methods(q4_1_weight(out, cols, out + cols))
            x = torch.randn(rows, cols)
            fns = {name: f for name, (f, _) in found.items()}
            xs = {name: x.to(dtype) for name, (_, dtype) in found.items()}
            for name, f in fns.items():
                f(xs[name])
            times: dict[str, list[float]] = {name: [] for name in fns}
            reps = 20 if rows <= 16 else 5
            for r in range(args.rounds):
                for name in fns if r % 2 == 0 else reversed(list(fns)):
                    t = time.perf_counter()
                    for _ in range(reps):
                        fns[name](xs[name])
                    times[name].append((time.perf_counter() - t) / reps * 1e6)
            per[shape] = {name: round(statistics.median(v), 1) for name, v in times.items()}
        per["layer (sum of the four)"] = {name: round(sum(per[s][name] for s in SHAPES), 1) for name in per["qkv"]}
        result[f"{rows}_rows_us"] = per
        print(rows, json.dumps(per["layer (sum of the four)"]), flush=True)
    return result


DECODE_VARIANTS = {"float32 dequantised": ("float32", "none"), "float32 as stored": ("float32", "auto"),
                   "bfloat16 dequantised": ("bfloat16", "none"), "bfloat16 as stored": ("bfloat16", "auto")}


def decode(args, save) -> dict:
    rng = random.Random(0)
    prompts = [[1] + [rng.randrange(3, 49152) for _ in range(15)] for _ in range(args.large)]
    batches = {f"{n}_seqs": prompts[:n] for n in (*args.small, args.large)}
    out_len = {k: args.large_out_len if k == f"{args.large}_seqs" else args.out_len for k in batches}
    llms, result = {}, {}
    blocks = args.large * -(-(16 + max(args.out_len, args.large_out_len)) // 16) + 16
    for name in args.variants:
        dtype, quantization = DECODE_VARIANTS[name]
        llm = LLM(DEFAULT_MODEL, dtype=dtype, quantization=quantization, num_kv_blocks=blocks, max_num_seqs=args.large,
                  num_threads=args.threads or None)
        llm.generate(prompts[:2], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))  # warm
        llms[name] = llm
        result[name] = {"runs": llm.engine.quantization, **{k: [] for k in batches}}
        print(name, result[name]["runs"], flush=True)
        gc.collect()
    names = list(llms)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            for key, batch in batches.items():
                params = SamplingParams(max_tokens=out_len[key], temperature=0, ignore_eos=True)
                t = time.perf_counter()
                llms[name].generate(batch, params)
                result[name][key].append(round(time.perf_counter() - t, 3))
            print(name, {k: result[name][k][-1] for k in batches}, flush=True)
        for v in result.values():
            v["out_tok_s"] = {k: round(len(b) * out_len[k] / statistics.median(v[k]), 1) for k, b in batches.items()}
        save(result | {"rounds_done": r + 1})  # after every round: a cut run keeps what it has
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["probe", "decode"])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 64])
    ap.add_argument("--small", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--large", type=int, default=64)
    ap.add_argument("--out-len", type=int, default=64)
    ap.add_argument("--large-out-len", type=int, default=32)
    ap.add_argument("--variants", nargs="+", default=list(DECODE_VARIANTS), choices=list(DECODE_VARIANTS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: as set up)")
    ap.add_argument("--out", default="bench/published")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    flags = cpu_flags()
    result = {"command": " ".join(sys.argv), "cpu": cpu_info(), "cpu_flags": sorted(f for f in FLAGS if f in flags),
              "threads": torch.get_num_threads(), "c_kernel_lanes": None if int4_kernel() is None else int4_kernel().out_tile,
              "int4_c_max_rows": Int4Linear.C_MAX_ROWS}
    out = Path(args.out) / f"int4-{args.what}-{time.strftime('%Y%m%d-%H%M%S')}.json"

    def save(part: dict) -> None:
        out.write_text(json.dumps(result | {args.what: part}, indent=1))

    save(probe(args) if args.what == "probe" else decode(args, save))
    print("->", out)


if __name__ == "__main__":
    main()
