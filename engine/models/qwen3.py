"""Qwen3: Llama layers with a per-head RMSNorm on queries and keys (before rotary), no biases."""

from __future__ import annotations

from engine.models.decoder import CausalLM, PreNormLayer
from engine.models.layers import RMSNorm


class Qwen3ForCausalLM(CausalLM):
    def build_layer(self, config, index: int):
        bias = bool(getattr(config, "attention_bias", False))
        attn = self.llama_attention(config, index, qkv_bias=bias, qk_norm=RMSNorm)
        return PreNormLayer(config, attn, self.llama_mlp(config))
