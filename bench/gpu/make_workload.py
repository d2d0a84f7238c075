"""Writes bench/gpu/summ-1024.json: the summarisation workload as token ids, so the GPU machine
(Python 3.12, no tokenizer of its own) runs exactly the requests built here.

bench/workload.py finds 509 standard-library docstrings in its prompt-length range; requests
509-1023 reuse the shared system-message prefix and then random token ids of the length of a
real prompt (a random-weight model reads lengths, not meaning), with fresh long-tailed budgets.

    PYTHONPATH=$PWD python bench/gpu/make_workload.py
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import workload  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from engine.model_registry import resolve_model  # noqa: E402

SOURCE = ("bench/gpu/make_workload.py: bench/workload.py build(smollm2-135m-instruct tokenizer, 509 requests, seed 0), "
          "then requests 509-1023 = the shared system prefix + random ids of a real prompt's length, "
          "budgets lognormal(4.25, 0.8) clipped to [16, 512], seed 1")


def main(n: int = 1024) -> None:
    tok = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))
    wl = workload.build(tok, num_requests=509)
    real = wl.prompts
    lcp = len(os.path.commonprefix([tuple(p) for p in real]))
    rng = random.Random(1)
    prompts, budgets = list(real), list(wl.max_tokens)
    while len(prompts) < n:
        src = real[(len(prompts) - len(real)) % len(real)]
        prompts.append(src[:lcp] + [rng.randrange(3, tok.vocab_size) for _ in range(len(src) - lcp)])
        budgets.append(int(min(512, max(16, rng.lognormvariate(4.25, 0.8)))))
    out = Path(__file__).with_name(f"summ-{n}.json")
    out.write_text(json.dumps({"source": SOURCE, "shared_prefix": lcp, "prompts": prompts, "max_tokens": budgets},
                              separators=(",", ":")))
    print(out, len(prompts), sum(map(len, prompts)), "prompt tokens", sum(budgets), "output tokens")


if __name__ == "__main__":
    main()
