"""Greedy decoding is token-for-token identical to HF transformers in every engine configuration."""

from __future__ import annotations

import pytest
from engine_cases import CONFIGS, chat_prompts, check, hf_greedy, random_prompts

from engine import LLM


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
