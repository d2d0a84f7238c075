"""Llama, Mistral and Qwen2 (and SmolLM, a Llama): pre-norm layers of grouped-query attention
and a SiLU-gated MLP. Qwen2 adds q/k/v biases; Mistral a sliding window where its config sets one."""

from __future__ import annotations

from engine.models.decoder import CausalLM, PreNormLayer
from engine.models.layers import RMSNorm, RotaryEmbedding

__all__ = ["LlamaForCausalLM", "RMSNorm", "RotaryEmbedding"]


class LlamaForCausalLM(CausalLM):
    def __init__(self, config, max_positions: int, qkv_bias: bool = False) -> None:
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported activation {config.hidden_act!r} (Llama-family models use silu)")
        super().__init__(config, max_positions, qkv_bias=qkv_bias)

    @classmethod
    def options_from_checkpoint(cls, config, names: set[str]) -> dict:
        return {"qkv_bias": any(n.endswith("self_attn.q_proj.bias") for n in names)}

    def build_layer(self, config, index: int, qkv_bias: bool = False):
        return PreNormLayer(config, self.llama_attention(config, index, qkv_bias=qkv_bias), self.llama_mlp(config))
