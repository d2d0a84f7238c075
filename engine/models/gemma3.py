"""Gemma 3 text: sliding-window layers interleaved with global ones (each type with its own
rotary base), per-head q/k norms, norms before and after both sublayers, all scaling by
``1 + weight``; a tanh-GELU gated MLP; embeddings scaled by sqrt(hidden size); tied LM head."""

from __future__ import annotations

from torch import nn

from engine.models.decoder import CausalLM
from engine.models.layers import GemmaRMSNorm, RotaryEmbedding, SelfAttention


class Gemma3Layer(nn.Module):
    def __init__(self, config, attn: SelfAttention, mlp: nn.Module) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(hidden, eps)
        self.self_attn = attn
        self.post_attention_layernorm = GemmaRMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, eps)
        self.mlp = mlp
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, eps)

    def forward(self, x, residual, positions, rotary, meta):
        """Same contract as ``PreNormLayer``: ``x`` is the previous sublayer's output, not yet in ``residual``."""
        h, residual = self.input_layernorm.forward(x, residual)
        h, _ = self.post_attention_layernorm.forward(self.self_attn.forward(h, positions, rotary, meta))
        h, residual = self.pre_feedforward_layernorm.forward(h, residual)
        h, _ = self.post_feedforward_layernorm.forward(self.mlp.forward(h))
        return h, residual


class Gemma3ForCausalLM(CausalLM):
    norm_class = GemmaRMSNorm

    def __init__(self, config, max_positions: int) -> None:
        if getattr(config, "attn_logit_softcapping", None) is not None:
            raise ValueError("Gemma 3 with attn_logit_softcapping is not supported")
        if getattr(config, "use_bidirectional_attention", False):
            raise ValueError("Gemma 3 with bidirectional attention is not a causal LM")
        super().__init__(config, max_positions)
        self.embed_scale = config.hidden_size**0.5
        self.final_logit_softcapping = getattr(config, "final_logit_softcapping", None)
        self.local = [t == "sliding_attention" for t in config.layer_types]

    def build_rotary(self, config, max_positions: int) -> None:
        """Global and sliding layers rotate with their own bases (1e6 and 1e4 in the 270M)."""
        self.rotary = RotaryEmbedding(config, self.head_dim, max_positions, layer_type="full_attention")
        self.rotary_local = RotaryEmbedding(config, self.head_dim, max_positions, layer_type="sliding_attention")

    def build_layer(self, config, index: int):
        attn = self.llama_attention(config, index, qkv_bias=bool(getattr(config, "attention_bias", False)),
                                    scale=config.query_pre_attn_scalar**-0.5, qk_norm=GemmaRMSNorm)
        return Gemma3Layer(config, attn, self.llama_mlp(config, act=config.hidden_activation))

    def rotary_for(self, index: int) -> RotaryEmbedding:
        return self.rotary_local if self.local[index] else self.rotary
