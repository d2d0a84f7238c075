"""Greedy decoding is token-for-token identical to HF transformers in every engine configuration."""

from __future__ import annotations

import pytest
from engine_cases import chat_prompts, hf_greedy, random_prompts

from engine import LLM, SamplingParams

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
    if name == "chunked-prefill":
        assert max(len(p) for p in prompts) > 24
    if name == "preemption":
        assert stats["preemptions"] > 0
    if name == "prefix-caching-on":
        assert stats["prefix_cache_hit_tokens"] > 0
    if name == "prefix-caching-off":
        assert stats["prefix_cache_hit_tokens"] == 0
    assert stats["kv_blocks_used_now"] == 0


@pytest.fixture(scope="module")
def tiny_case(tiny_model_dir):
    prompts = random_prompts(16)
    return prompts, hf_greedy(tiny_model_dir, prompts, 24)


@pytest.fixture(scope="module")
def real_case(default_model_dir):
    from transformers import AutoTokenizer

    prompts = chat_prompts(AutoTokenizer.from_pretrained(default_model_dir))
    return prompts, hf_greedy(default_model_dir, prompts, 20)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_tiny_llama_matches_hf(tiny_model_dir, tiny_case, name, async_scheduling):
    """Async scheduling (step t+1 scheduled with placeholders for step t's tokens) gives the same
    tokens as HF in every mode, preemption of sequences whose token is in flight included."""
    prompts, refs = tiny_case
    cfg = dict(num_kv_blocks=256, max_num_seqs=16, async_scheduling=async_scheduling) | CONFIGS[name]
    check(LLM(str(tiny_model_dir), **cfg), prompts, refs, name, 24)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_default_model_matches_hf(default_model_dir, real_case, name):
    prompts, refs = real_case
    cfg = dict(num_kv_blocks=256, max_num_seqs=16) | CONFIGS[name]
    if name == "preemption":
        cfg["num_kv_blocks"] = 16
    if name == "chunked-prefill":
        cfg["max_num_batched_tokens"] = 48
    assert max(len(p) for p in prompts) > 48
    check(LLM("smollm2-135m-instruct", **cfg), prompts, refs, name, 20)
