"""Model fixtures: the real default model, and a tiny random-weight Llama that shares its tokenizer."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    from engine.model_registry import resolve_model

    return resolve_model("smollm2-135m-instruct")


def build_tiny_llama(out: Path, tokenizer_from: Path | None, seed: int = 0, **overrides) -> Path:
    """A 2-layer Llama with random weights; large init so greedy argmax has no near-ties."""
    import torch  # here, so the torch-free subset (make pythons) loads the shared fixtures
    from transformers import LlamaConfig, LlamaForCausalLM

    params = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=49152, max_position_embeddings=1024, initializer_range=0.2,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-5,
    )
    params.update(overrides)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**params)).to(torch.float32)
    model.save_pretrained(out)
    if tokenizer_from is not None:
        for name in TOKENIZER_FILES:
            if (tokenizer_from / name).is_file():
                shutil.copy(tokenizer_from / name, out / name)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, default_model_dir) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), default_model_dir)
