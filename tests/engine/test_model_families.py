"""Llama-family HF directories other than Llama load and decode exactly like HF."""

from __future__ import annotations

import shutil

import pytest
import torch
from engine_cases import hf_greedy, random_prompts
from model_fixtures import TOKENIZER_FILES

from engine import LLM, SamplingParams

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=49152, max_position_embeddings=512, initializer_range=0.2,
             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


def build(kind: str, out, tokenizer_from):
    import transformers

    if kind == "qwen2":
        config = transformers.Qwen2Config(**SMALL, use_sliding_window=False)
        model_cls = transformers.Qwen2ForCausalLM
    elif kind == "mistral":
        config = transformers.MistralConfig(**SMALL, sliding_window=None)
        model_cls = transformers.MistralForCausalLM
    elif kind == "llama3-rope":  # Llama 3.x's frequency-dependent rope scaling (it once failed to load)
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64, "rope_theta": 500000.0}
        config = transformers.LlamaConfig(**SMALL, rope_scaling=rope)
        model_cls = transformers.LlamaForCausalLM
    else:
        config = transformers.LlamaConfig(**SMALL | {"tie_word_embeddings": True})
        model_cls = transformers.LlamaForCausalLM
    torch.manual_seed(1)
    model = model_cls(config)
    if kind == "qwen2":  # make the q/k/v biases matter
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).is_file():
            shutil.copy(tokenizer_from / name, out / name)
    return out


@pytest.mark.parametrize("kind", ["qwen2", "mistral", "llama-tied", "llama3-rope"])
def test_family_matches_hf(kind, tmp_path, default_model_dir):
    model_dir = build(kind, tmp_path / kind, default_model_dir)
    prompts = random_prompts(6, seed=2)
    refs = hf_greedy(model_dir, prompts, 12)
    outs = LLM(str(model_dir), num_kv_blocks=128, max_num_batched_tokens=40).generate(
        prompts, SamplingParams(max_tokens=12, temperature=0))
    assert [o.token_ids for o in outs] == refs


def test_unsupported_architecture_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}')
    supported = ("Gemma3ForCausalLM, LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM, Phi3ForCausalLM, "
                 "Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM")
    with pytest.raises(ValueError, match=rf"has architectures \['GPT2LMHeadModel'\]; tokenmill runs {supported}$"):
        LLM(str(tmp_path))


def test_checkpoint_names_without_the_model_prefix_still_load(tmp_path, default_model_dir):
    """Tensors named ``layers.0...`` instead of ``model.layers.0...`` load as before the registry."""
    from safetensors.torch import load_file, save_file

    model_dir = build("llama-tied", tmp_path / "m", default_model_dir)
    tensors = load_file(model_dir / "model.safetensors")
    save_file({k.removeprefix("model."): v for k, v in tensors.items()}, model_dir / "model.safetensors",
              metadata={"format": "pt"})
    prompts = random_prompts(2, seed=4)
    outs = LLM(str(model_dir), num_kv_blocks=32).generate(prompts, SamplingParams(max_tokens=4, temperature=0))
    assert [o.token_ids for o in outs] == hf_greedy(model_dir, prompts, 4)
