"""tokenmill beside llama.cpp on the issue-44 uniform batch, one run, runs alternating.

llama.cpp is a peer, never a dependency: build ``llama-batched-bench`` and ``llama-quantize`` from
the vendored tree of the ``llama-cpp-python`` sdist and pass their folder as ``--llama-bin``:

    pip download --no-deps --no-binary :all: llama-cpp-python -d /tmp/llamacpp
    tar xzf /tmp/llamacpp/llama_cpp_python-*.tar.gz -C /tmp/llamacpp
    cd /tmp/llamacpp/llama_cpp_python-*/vendor/llama.cpp && cmake -B build -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF && cmake --build build -j2 --target llama-batched-bench llama-quantize
    PYTHONPATH=$PWD .venv/bin/python bench/bench_llamacpp.py --llama-bin .../build/bin --out bench/published

Both sides run ``--prompts`` sequences of ``--prompt-len`` prompt and ``--out-len`` generated
tokens in parallel (llama.cpp: ``-npl``/``-npp``/``-ntg``, prompts not shared; tokenmill: random
prompts, EOS ignored). The GGUF types come from the packaged Q4_1 file by ``llama-quantize
--allow-requantize``: its dequantised weights are exactly the float model tokenmill's float
variants load, so F32 and BF16 are the same weights on both sides. Pairs: F32 / float32, BF16 /
bfloat16, Q8_0 / int8 W8A8 (compressed-tensors, ``tests/quant_checkpoints.py``), Q4_1 / the
packaged GGUF as stored (float32 rows, ``LLM()``'s default, and bfloat16 rows).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bench_quantized import matmul_ceiling, simd_flags, timed  # noqa: E402
from sysinfo import cpu_info  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402
from engine.model_registry import DEFAULT_MODEL, cache_dir, resolve_model  # noqa: E402

# llama.cpp type -> tokenmill variants run beside it: (name, folder kind, dtype, quantization)
PAIRS = {"F32": [("float32", "float", "float32", "none")],
         "BF16": [("bfloat16", "float", "bfloat16", "none")],
         "Q8_0": [("int8-w8a8", "int8", "bfloat16", "auto")],
         "Q4_1": [("gguf-q4_1-float32", "float", "float32", "auto"), ("gguf-q4_1", "float", "bfloat16", "auto")]}


def gguf_files(bin_dir: Path, source: Path, work: Path) -> dict[str, Path]:
    """Each llama.cpp type's file, requantized once from the packaged Q4_1 GGUF."""
    work.mkdir(parents=True, exist_ok=True)
    files = {"Q4_1": source}
    for kind in ("F32", "BF16", "Q8_0"):
        out = work / f"{DEFAULT_MODEL}-{kind.lower()}.gguf"
        if not out.is_file():
            subprocess.run([str(bin_dir / "llama-quantize"), "--allow-requantize", str(source), str(out), kind],
                           check=True, capture_output=True)
        files[kind] = out
    return files


def llamacpp_run(bin_dir: Path, model: Path, args) -> dict:
    """One ``llama-batched-bench`` run: its prompt, generation and total seconds."""
    ctx = args.prompts * (args.prompt_len + args.out_len) + 256
    cmd = [str(bin_dir / "llama-batched-bench"), "-m", str(model), "-c", str(ctx), "-b", "2048", "-ub", "512",
           "-npp", str(args.prompt_len), "-ntg", str(args.out_len), "-npl", str(args.prompts),
           "-t", str(args.threads), "-tb", str(args.threads)]
    proc = subprocess.run(cmd, check=True, capture_output=True, text=True)
    row = next(line for line in proc.stdout.splitlines() if re.match(rf"\|\s*{args.prompt_len}\s*\|", line))
    cells = [c.strip() for c in row.strip().strip("|").split("|")]
    # | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
    return {"pp_s": float(cells[4]), "tg_s": float(cells[6]), "total_s": float(cells[8])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-bin", required=True, type=Path, help="folder with llama-batched-bench, llama-quantize")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=338)
    ap.add_argument("--out-len", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--types", default="F32,BF16,Q8_0,Q4_1")
    ap.add_argument("--out", default="bench/published")
    args = ap.parse_args()
    src = resolve_model(DEFAULT_MODEL)
    files = gguf_files(args.llama_bin, src / "gguf" / "model.gguf", cache_dir() / "llamacpp")
    types = args.types.split(",")
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 49152) for _ in range(args.prompt_len)] for _ in range(args.prompts)]
    params = SamplingParams(max_tokens=args.out_len, temperature=0, ignore_eos=True)
    blocks = args.prompts * -(-(args.prompt_len + args.out_len) // 16) + 64
    result = {"command": " ".join(sys.argv), "cpu": cpu_info() | simd_flags(), "workload": vars(args) | {
        "llama_bin": str(args.llama_bin)}, "llamacpp": {}, "tokenmill": {}}
    result["workload"].pop("out")
    print("cpu", result["cpu"], flush=True)
    llms = {}
    for kind in types:
        for name, folder_kind, dtype, quant in PAIRS[kind]:
            folder = src if folder_kind == "float" else cache_dir() / "quantized" / f"{DEFAULT_MODEL}-int8-g64"
            if not (folder / "config.json").is_file():
                from quant_checkpoints import write_quantized
                write_quantized(src, folder, "int8", 64)
            llms[name] = LLM(str(folder), dtype=dtype, quantization=quant, num_kv_blocks=blocks)
            result["tokenmill"][name] = {"pair": kind, "runs": llms[name].engine.quantization, "total_s": []}
            timed(llms[name], prompts, params)  # warm: first touch of the KV pool, oneDNN's kernels
        result["llamacpp"][kind] = {"file": files[kind].name, "runs": []}  # its own process each run: no warm-up
    result["matmul_ceiling_gflops"] = matmul_ceiling()
    out = Path(args.out) / f"llamacpp-side-by-side-{time.strftime('%Y%m%d-%H%M%S')}.json"
    for r in range(args.rounds):
        for kind in types if r % 2 == 0 else types[::-1]:
            lc = llamacpp_run(args.llama_bin, files[kind], args)
            result["llamacpp"][kind]["runs"].append(lc)
            line = [f"{kind} llama.cpp {lc['total_s']:.2f}s"]
            for name, *_ in PAIRS[kind]:
                secs, _ = timed(llms[name], prompts, params)
                result["tokenmill"][name]["total_s"].append(round(secs, 2))
                line.append(f"{name} {secs:.2f}s")
            print(f"round {r}: " + ", ".join(line), flush=True)
        summarize(result)
        out.write_text(json.dumps(result, indent=1))  # after every round: a cut run keeps what it has
    print(json.dumps({"llamacpp": {k: v["median_s"] for k, v in result["llamacpp"].items()},
                      "tokenmill": {k: (v["median_s"], v["vs_llamacpp"]) for k, v in result["tokenmill"].items()}},
                     indent=1), "->", out)


def summarize(result: dict) -> None:
    """Medians, and each tokenmill variant's speed against its llama.cpp pair and our bfloat16."""
    for v in result["llamacpp"].values():
        v["median_s"] = statistics.median(run["total_s"] for run in v["runs"])
    base = result["tokenmill"].get("bfloat16")
    for v in result["tokenmill"].values():
        v["median_s"] = statistics.median(v["total_s"])
        v["vs_llamacpp"] = round(result["llamacpp"][v["pair"]]["median_s"] / v["median_s"], 2)
        if base:
            v["vs_bfloat16"] = round(statistics.median(base["total_s"]) / v["median_s"], 3)


if __name__ == "__main__":
    main()
