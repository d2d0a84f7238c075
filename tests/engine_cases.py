"""Shared prompts and HF references for the engine equality tests."""

from __future__ import annotations

import functools
import random
from pathlib import Path

import torch
from hf_reference_cache import cached_reference

from engine import LLM, SamplingParams

INSTRUCTION = "You are a careful assistant. Summarise the document in one short sentence."

DOCUMENTS = [
    "The cat sat on the mat.",
    "Water boils at 100 degrees Celsius at sea level, and at lower temperatures at altitude.",
    "Python is a programming language that lets you work quickly and integrate systems more effectively. "
    "It is used for web development, data science, scripting and automation.",
    "hi",
    "The mitochondria is the powerhouse of the cell. It produces ATP through cellular respiration, "
    "a process that uses oxygen and glucose.",
    "Rome was not built in a day.",
    "A paged KV cache splits the keys and values of every sequence into fixed-size blocks, so memory "
    "is allocated on demand and almost nothing is wasted. Blocks are found through a block table, "
    "and full blocks can be shared between requests that start with the same tokens.",
    "Tomorrow will be sunny with a light breeze from the west.",
    "The quarterly report shows revenue up 12 percent, costs flat, and a new office opening in Lisbon "
    "next spring. Hiring will focus on engineering and support.",
    "Bees communicate the location of flowers with a waggle dance.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The meeting is moved to Thursday at 3 pm in room 4B; bring the budget draft and the slides.",
    "Continuous batching lets a finished sequence leave the batch at once, and a waiting one takes its "
    "slot, so the hardware never idles while long requests finish. " * 3,
    "Salt.",
    "An apple a day keeps the doctor away, or so the saying goes, though evidence is thin.",
    "The library closes at 8 pm on weekdays and 5 pm on weekends; late returns cost 20 cents a day.",
]


def chat_prompts(tokenizer) -> list[list[int]]:
    out = []
    for doc in DOCUMENTS:
        msgs = [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": doc}]
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def random_prompts(n: int = 16, seed: int = 0, vocab: int = 49152, shared: int = 20) -> list[list[int]]:
    """Token-id prompts of mixed lengths 1..120; most start with a shared 20-token prefix."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, vocab) for _ in range(shared)]
    prompts = []
    for i in range(n):
        length = [1, 5, 15, 16, 17, 33, 47, 64, 80, 100, 120][i % 11]
        body = [rng.randrange(3, vocab) for _ in range(length)]
        prompts.append(body if i % 4 == 3 else prefix + body)
    return prompts


@functools.lru_cache(maxsize=4)
def hf_model(model_dir: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """HF transformers reference: one prompt at a time, no padding, greedy, float32 (computed once
    per model, prompts, versions and CPU: see hf_reference_cache)."""

    def compute() -> list[list[int]]:
        model = hf_model(str(model_dir))
        outs = []
        with torch.inference_mode():
            for p in prompts:
                gen = model.generate(
                    torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                    max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=2,
                )
                outs.append(gen[0, len(p):].tolist())
        return outs

    request = {"kind": "greedy", "dtype": "float32", "pad_token_id": 2, "max_new_tokens": max_new_tokens,
               "prompts": [list(p) for p in prompts]}
    return cached_reference(model_dir, request, compute)


# Engine configurations every equality test runs (each exercises one mechanism; check() asserts it ran).
CONFIGS = {
    "prefix-caching-on": dict(enable_prefix_caching=True),
    "prefix-caching-off": dict(enable_prefix_caching=False),
    "chunked-prefill": dict(max_num_batched_tokens=24),
    "preemption": dict(num_kv_blocks=14, max_num_batched_tokens=64),
    "static": dict(scheduling="static", max_num_seqs=5),
    "contiguous": dict(kv_allocation="contiguous"),
}


def check(llm: LLM, prompts, refs, name: str, max_tokens: int) -> None:
    outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0))
    for i, (out, ref) in enumerate(zip(outs, refs, strict=True)):
        assert out.error is None
        assert out.token_ids == ref, f"{name}: prompt {i} differs from HF"
    stats = llm.stats()
    mode = name.split()[-1]  # "preemption", or "qwen3 preemption" from the model zoo
    if mode == "chunked-prefill":
        assert max(len(p) for p in prompts) > 24
    if mode.endswith("preemption"):
        assert stats["preemptions"] > 0
    if mode == "prefix-caching-on":
        assert stats["prefix_cache_hit_tokens"] > 0
    if mode == "prefix-caching-off":
        assert stats["prefix_cache_hit_tokens"] == 0
    assert stats["kv_blocks_used_now"] == 0
