"""Tiny random-weight HF checkpoints of each model family, for the equality tests.

Every config is 2-3 layers of width 64 with a large init (greedy argmax has no near-ties) and
the default model's tokenizer. Norm weights are randomised too (HF initialises them to one, or
zero for Gemma's ``1 + weight``), so a norm applied wrongly changes the tokens.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from model_fixtures import TOKENIZER_FILES

WINDOW = 20  # not a multiple of the block size (16): windows start inside blocks
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=49152, max_position_embeddings=512, initializer_range=0.2,
             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
PHI_ORIGINAL_CONTEXT = 96  # Phi's longrope switches to its long factors past this position


def _phi3(t):
    rotary = int(16 * 0.75)  # head_dim 16, Phi-4-mini's partial rotary factor
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
            "short_factor": [1.0 + 0.1 * i for i in range(rotary // 2)],
            "long_factor": [2.0 + 0.5 * i for i in range(rotary // 2)],
            "original_max_position_embeddings": PHI_ORIGINAL_CONTEXT}
    return t.Phi3Config(**SMALL, rope_parameters=rope, original_max_position_embeddings=PHI_ORIGINAL_CONTEXT,
                        sliding_window=WINDOW, pad_token_id=0), t.Phi3ForCausalLM


def _gemma3(t):
    cfg = t.Gemma3TextConfig(
        **SMALL | dict(num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True),
        head_dim=64, query_pre_attn_scalar=48, sliding_window=WINDOW, pad_token_id=0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], final_logit_softcapping=30.0,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}})
    return cfg, t.Gemma3ForCausalLM


FAMILIES = {
    "qwen3": lambda t: (t.Qwen3Config(**SMALL, head_dim=32, use_sliding_window=True, sliding_window=WINDOW,
                                      max_window_layers=1), t.Qwen3ForCausalLM),
    "gemma3": _gemma3,
    "phi3": _phi3,
    "mistral-window": lambda t: (t.MistralConfig(**SMALL, sliding_window=WINDOW), t.MistralForCausalLM),
    # Layer 0 dense (mlp_only_layers), layer 1 sparse: 8 experts, top 2, normalised as Qwen3-30B-A3B's
    "qwen3-moe": lambda t: (t.Qwen3MoeConfig(**SMALL, head_dim=32, num_experts=8, num_experts_per_tok=2,
                                            moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[0],
                                            decoder_sparse_step=1), t.Qwen3MoeForCausalLM),
    "mixtral": lambda t: (t.MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW),
                          t.MixtralForCausalLM),
}


def build_family(kind: str, out: Path, tokenizer_from: Path, seed: int = 1) -> Path:
    import transformers

    config, model_cls = FAMILIES[kind](transformers)
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.normal_(0.0 if "gemma" in kind else 1.0, 0.3)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).is_file():
            shutil.copy(tokenizer_from / name, out / name)
    return out
