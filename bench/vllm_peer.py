"""vLLM's CPU backend as a benchmark peer, run inside its own virtualenv (never imported by tokenmill).

    ../shared/tools/vllm-cpu python bench/vllm_peer.py --model DIR --dtype float32 --workloads W.json

``W.json`` maps a workload name to ``{"prompts": [[token ids]], "max_tokens": [..]}``: the exact
ids and budgets tokenmill runs. The peer builds one engine (vLLM defaults: block size 128,
chunked prefill, prefix caching, torch.compile), warms it up, prints ``READY``, then reads
workload names on stdin, one per line, runs each with EOS ignored and prints
``RESULT {json}``. An empty line or EOF ends it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", required=True)
    ap.add_argument("--workloads", required=True)
    args = ap.parse_args()

    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    workloads = json.loads(open(args.workloads).read())
    t = time.perf_counter()
    llm = LLM(args.model, dtype=args.dtype, seed=0)
    startup = time.perf_counter() - t
    warm = next(iter(workloads.values()))
    warm = warm["prompts"][:12]
    llm.generate([TokensPrompt(prompt_token_ids=p[: 48 + 16 * i]) for i, p in enumerate(warm)],
                 [SamplingParams(max_tokens=2 + 3 * i, temperature=0) for i in range(len(warm))], use_tqdm=False)
    info = {"vllm": vllm.__version__, "torch": torch.__version__, "startup_s": startup,
            "omp_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"), "kv_space_gb": os.environ.get("VLLM_CPU_KVCACHE_SPACE")}
    print("READY " + json.dumps(info), flush=True)
    for line in sys.stdin:
        name = line.strip()
        if not name:
            break
        wl = workloads[name]
        llm.reset_prefix_cache()
        prompts = [TokensPrompt(prompt_token_ids=p) for p in wl["prompts"]]
        params = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True) for m in wl["max_tokens"]]
        t = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t
        out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        cached = sum(o.num_cached_tokens or 0 for o in outs)
        print("RESULT " + json.dumps({"workload": name, "wall_s": wall, "output_tokens": out_tokens,
                                      "prefix_hit_tokens": cached}), flush=True)


if __name__ == "__main__":
    main()
