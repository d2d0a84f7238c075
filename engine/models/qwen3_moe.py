"""Qwen3-MoE (Qwen3-30B-A3B and kin): Qwen3 attention (per-head q/k norms) with a sparse
mixture-of-experts feed-forward on every ``decoder_sparse_step``-th layer not listed in
``mlp_only_layers`` (a dense MLP there)."""

from __future__ import annotations

from engine.models.decoder import CausalLM, PreNormLayer
from engine.models.layers import GatedMLP, RMSNorm
from engine.models.moe import SparseMoE


class Qwen3MoeForCausalLM(CausalLM):
    def build_layer(self, config, index: int):
        attn = self.llama_attention(config, index, qkv_bias=bool(getattr(config, "attention_bias", False)),
                                    qk_norm=RMSNorm)
        sparse = (index not in (config.mlp_only_layers or []) and config.num_experts > 0
                  and (index + 1) % config.decoder_sparse_step == 0)
        if sparse:
            mlp = SparseMoE(config.hidden_size, config.moe_intermediate_size, config.num_experts,
                            config.num_experts_per_tok, config.norm_topk_prob,
                            ("gate_proj", "up_proj", "down_proj"), config.hidden_act)
        else:
            mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act)
        return PreNormLayer(config, attn, mlp)
