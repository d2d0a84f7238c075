"""Phi-3 and Phi-4-mini: Llama layers whose checkpoint stores q/k/v and gate/up already fused
(``qkv_proj``, ``gate_up_proj``), with partial rotary (Phi-4-mini rotates 3/4 of each head) and
longrope scaling (see ``RotaryEmbedding``)."""

from __future__ import annotations

from engine.models.decoder import CausalLM, PreNormLayer


class Phi3ForCausalLM(CausalLM):
    def build_layer(self, config, index: int):
        attn = self.llama_attention(config, index, fused_checkpoint=True)
        return PreNormLayer(config, attn, self.llama_mlp(config, fused_checkpoint=True))
