"""Mixtral: Mistral attention (sliding window where the config sets one) with a sparse
mixture-of-experts feed-forward in every layer (``block_sparse_moe``; experts' w1/w3/w2 are
gate/up/down; the top-k weights always renormalised, kept in float32 as HF keeps them)."""

from __future__ import annotations

from torch import nn

from engine.models.decoder import CausalLM, PreNormLayer
from engine.models.moe import SparseMoE


class MixtralLayer(PreNormLayer):
    """PreNormLayer whose feed-forward carries Mixtral's checkpoint name."""

    def __init__(self, config, attn, moe: SparseMoE) -> None:
        super().__init__(config, attn, nn.Identity())
        del self.mlp
        self.block_sparse_moe = moe

    @property
    def mlp(self):  # PreNormLayer.forward calls self.mlp
        return self.block_sparse_moe


class MixtralForCausalLM(CausalLM):
    def build_layer(self, config, index: int):
        moe = SparseMoE(config.hidden_size, config.intermediate_size, config.num_local_experts,
                        config.num_experts_per_tok, True, ("w1", "w3", "w2"), config.hidden_act, cast_weights=False)
        return MixtralLayer(config, self.llama_attention(config, index), moe)
