"""The packaged Gemma 3 270M (Q4_K_M GGUF) as stored against its dequantised self, in one short run.

Variants: as stored (bfloat16 activations: Q4_K as int4, Q5_0/Q8_0 as int8 weight-only, Q6_K and
the tied embedding / LM head bfloat16), dequantised to bfloat16 (and float32: bytes only). Measured:
resident weight bytes, decode tokens/s of ``--small`` and ``--large`` sequences (``--prompt-len``
random prompt tokens, ``--out-len`` new tokens, EOS ignored), variants alternating round by round
(order reversed every round), medians; and the two ways of multiplying a group-of-32 int8 weight
(Q8_0/Q5_0) on a 2048 x 640 weight at 4 and 64 rows, alternating pairs, medians.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_gguf.py --out bench/published
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
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from quant_checkpoints import weight_bytes  # noqa: E402
from sysinfo import cpu_info  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402
from engine.cpu_info import cpu_flags  # noqa: E402
from engine.model_registry import GEMMA3_270M  # noqa: E402

VARIANTS = {"as stored (bfloat16)": ("bfloat16", "auto"), "dequantised bfloat16": ("bfloat16", "none"),
            "dequantised float32": ("float32", "none")}
TIMED = ("as stored (bfloat16)", "dequantised bfloat16")



def int8_group_options(rounds: int = 5) -> dict:
    """ms per product of a 2048 x 640 Q8_0-like weight: float32 / bfloat16 F.linear, weight-only
    dequantised per call (kept), int8 x int8 per group of 32 (one torch._int_mm per group)."""
    n, k, g = 2048, 640, 32
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    d = (torch.rand(n, k // g, generator=gen) * 0.01).half()
    w32 = (q.view(n, -1, g) * d.float().unsqueeze(-1)).view(n, k)
    groups = [q[:, i * g:(i + 1) * g].t().contiguous() for i in range(k // g)]
    dt = d.float().t().contiguous()

    def weight_only(x):
        w = torch.mul(q.view(n, -1, g), d.float().unsqueeze(-1)).view(n, k)
        return torch.nn.functional.linear(x, w if x.dtype == torch.float32 else w.to(x.dtype))

    def per_group(x):
        x32 = x.float()
        sx = x32.abs().amax(1, keepdim=True).clamp_(min=1e-12) / 127
        xq = torch.round(x32 / sx).clamp_(-127, 127).to(torch.int8)
        out = torch.zeros(x.shape[0], n)
        for i, qg in enumerate(groups):
            out.add_(torch._int_mm(xq[:, i * g:(i + 1) * g].contiguous(), qg).float() * dt[i])
        return out * sx

    options = {"float32 F.linear": lambda x: torch.nn.functional.linear(x.float(), w32),
               "bfloat16 F.linear": lambda x: torch.nn.functional.linear(x, w32.bfloat16()),
               "int8 weight-only, dequantised per call": weight_only,
               "int8 x int8 per group (_int_mm per 32 columns)": per_group}
    out = {}
    for rows in (4, 64):
        x = torch.randn(rows, k).bfloat16()
        times: dict[str, list[float]] = {name: [] for name in options}
        for r in range(rounds):
            for name in options if r % 2 == 0 else reversed(options):
                options[name](x)
                t = time.perf_counter()
                for _ in range(5):
                    options[name](x)
                times[name].append((time.perf_counter() - t) / 5 * 1e3)
        out[f"{rows}_rows_ms"] = {name: round(statistics.median(v), 3) for name, v in times.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", type=int, default=4)
    ap.add_argument("--large", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--out-len", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="bench/published")
    args = ap.parse_args()
    rng = random.Random(0)
    prompts = [[2] + [rng.randrange(3, 262144) for _ in range(args.prompt_len - 1)] for _ in range(args.large)]
    flags = cpu_flags()
    result = {"command": " ".join(sys.argv), "cpu": cpu_info(), "model": GEMMA3_270M,
              "cpu_flags": sorted(f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16",
                                              "amx_int8") if f in flags),
              "threads": torch.get_num_threads(), "variants": {}}
    out = Path(args.out) / f"gguf-{time.strftime('%Y%m%d-%H%M%S')}.json"
    result["int8_group_options"] = int8_group_options()
    print(json.dumps(result["int8_group_options"]), flush=True)
    llms = {}
    blocks = args.large * -(-(args.prompt_len + args.out_len) // 16) + 16
    for name, (dtype, quantization) in VARIANTS.items():
        llm = LLM(GEMMA3_270M, dtype=dtype, quantization=quantization, num_kv_blocks=blocks, max_num_seqs=args.large)
        result["variants"][name] = {"dtype": dtype, "quantization": quantization, "runs": llm.engine.quantization,
                                    "weight_bytes": weight_bytes(llm), "small_s": [], "large_s": []}
        print(name, result["variants"][name]["runs"], result["variants"][name]["weight_bytes"], flush=True)
        if name in TIMED:  # float32's bytes only: three models at once ran this shared machine out of memory
            llm.generate(prompts[:2], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))  # warm
            llms[name] = llm
        else:
            del result["variants"][name]["small_s"], result["variants"][name]["large_s"]
        del llm
        gc.collect()
    params = SamplingParams(max_tokens=args.out_len, temperature=0, ignore_eos=True)
    names = list(llms)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            v = result["variants"][name]
            for key, batch in (("small_s", prompts[: args.small]), ("large_s", prompts)):
                t = time.perf_counter()
                llms[name].generate(batch, params)
                v[key].append(round(time.perf_counter() - t, 3))
            print(name, "small", v["small_s"][-1], "large", v["large_s"][-1], flush=True)
        for v in (result["variants"][n] for n in names):
            v["small_out_tok_s"] = round(args.small * args.out_len / statistics.median(v["small_s"]), 1)
            v["large_out_tok_s"] = round(args.large * args.out_len / statistics.median(v["large_s"]), 1)
        result["rounds_done"] = r + 1
        out.write_text(json.dumps(result, indent=1))  # after every round: a cut run keeps what it has
    print(json.dumps(result["variants"], indent=1), "->", out)


if __name__ == "__main__":
    main()
