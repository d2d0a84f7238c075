"""Does a structured-output request slow down the unconstrained requests in its batch?

Runs the same batch of unconstrained greedy requests (fixed length, ``ignore_eos``) with
and without constrained mates whose grammar stays active for the whole run, alternating
the two arms to share the machine's noise, and reports the unconstrained requests'
output tokens per second and the mean step time.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_structured_mates.py --requests 32 --tokens 48
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import LLM, SamplingParams, StructuredOutput  # noqa: E402
from engine.model_registry import DEFAULT_MODEL  # noqa: E402

TOPICS = ["the sea", "a city at night", "bread", "winter", "a long train ride", "bees", "the moon", "rain"]


def run_arm(llm: LLM, prompts: list[list[int]], mate_prompt: list[int], tokens: int, mates: int) -> dict:
    plain = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    # A regex that never completes before max_tokens: the mask is filled and applied every step.
    constrained = SamplingParams(
        max_tokens=tokens, temperature=0, structured_output=StructuredOutput(regex=r"[a-z ,.]{1,500}")
    )
    steps0 = llm.stats()["steps"]
    masking = [0.0]
    apply_masks = llm.engine.structured.apply_masks

    def timed(logits, matchers):  # the only work a constrained row adds to the step
        t0 = time.perf_counter()
        out = apply_masks(logits, matchers)
        masking[0] += time.perf_counter() - t0
        return out

    llm.engine.structured.apply_masks = timed
    t = time.perf_counter()
    outs = llm.generate(prompts + [mate_prompt] * mates, [plain] * len(prompts) + [constrained] * mates)
    wall = time.perf_counter() - t
    llm.engine.structured.apply_masks = apply_masks
    steps = llm.stats()["steps"] - steps0
    assert all(len(o.token_ids) == tokens for o in outs[: len(prompts)])
    return {"wall_s": wall, "steps": steps, "step_ms": 1000 * wall / steps,
            "unconstrained_tok_per_s": len(prompts) * tokens / wall,
            "mask_ms_per_step": 1000 * masking[0] / steps,
            "mate_tokens": [len(o.token_ids) for o in outs[len(prompts):]]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--mates", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/published/structured-mates.json")
    args = ap.parse_args()
    llm = LLM(DEFAULT_MODEL, num_kv_blocks=1024, enable_prefix_caching=False)
    prompts = [llm.engine.apply_chat_template([{"role": "user", "content": f"Write about {TOPICS[i % 8]} (#{i})."}])
               for i in range(args.requests)]
    mate = llm.engine.apply_chat_template([{"role": "user", "content": "Describe a garden in lower case."}])
    run_arm(llm, prompts[:4], mate, 4, 1)  # warm-up: compiles the grammar, builds the tokenizer info
    arms: dict[str, list[dict]] = {"alone": [], "with_mates": []}
    for _ in range(args.repeats):
        arms["alone"].append(run_arm(llm, prompts, mate, args.tokens, 0))
        arms["with_mates"].append(run_arm(llm, prompts, mate, args.tokens, args.mates))
    summary = {
        name: {"median_unconstrained_tok_per_s": statistics.median(r["unconstrained_tok_per_s"] for r in runs),
               "median_step_ms": statistics.median(r["step_ms"] for r in runs),
               "median_mask_ms_per_step": statistics.median(r["mask_ms_per_step"] for r in runs)}
        for name, runs in arms.items()
    }
    ratio = summary["with_mates"]["median_unconstrained_tok_per_s"] / summary["alone"]["median_unconstrained_tok_per_s"]
    result = {"args": vars(args), "runs": arms, "summary": summary, "with_mates_over_alone": ratio}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(summary, indent=2), f"\nratio with/without constrained mates: {ratio:.3f}\nwrote {args.out}")


if __name__ == "__main__":
    main()
