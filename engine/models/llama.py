"""Llama-family decoder (Llama, Mistral, Qwen2, SmolLM) over flat token batches.

The model never sees a batch dimension: a step is ``T`` tokens from many sequences,
and attention reaches each sequence's history through the paged KV pool.

Submodules are called through ``.forward`` directly: ``Module.__call__`` (hook dispatch) cost
about 3 us a call, some 300 calls a step, and no hooks are used here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from engine.attention import Attention, AttentionMetadata
from engine.models import fused
from engine.models.linear import Linear


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """``(normed, residual)``; with ``residual``, it becomes ``residual + x`` (in place) first."""
        return fused.rms_norm(x, self.weight, self.eps, residual)


class RotaryEmbedding(nn.Module):
    """Cos/sin table for every position up to the context length, built once."""

    def __init__(self, config, head_dim: int, max_positions: int) -> None:
        super().__init__()
        rope_params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        rope_type = rope_params.get("rope_type", rope_params.get("type", "default"))
        if rope_type == "default":
            inv_freq, scaling = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
        else:
            # device None: the current default, so building under ``torch.device("meta")`` (the
            # loader does, then rebuilds this module) stays on meta instead of copying out of it.
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, None)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq.float())
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos() * scaling, persistent=False)
        self.register_buffer("sin", emb.sin() * scaling, persistent=False)

    def _apply(self, fn, recurse=True):
        """Follow the model to its device but keep the tables in float32 (a bfloat16 model's
        ``.to(dtype)`` would round them): the fused kernel takes float32 tables and rounds each
        value to the model's dtype as it reads it, as the torch fallback does at use."""
        cos, sin = self.cos, self.sin
        super()._apply(fn, recurse)
        if not cos.is_meta:  # a model built on the meta device gets its tables rebuilt by the loader
            self.cos, self.sin = cos.to(self.cos.device), sin.to(self.sin.device)
        return self

    def rotate_(self, positions: torch.Tensor, qkv: torch.Tensor, num_heads: int, head_dim: int) -> None:
        """Rotate the first ``num_heads`` heads (q, then k) of each fused qkv row, in place."""
        fused.rotary_(qkv, num_heads, head_dim, positions, self.cos, self.sin)


class LlamaAttention(nn.Module):
    def __init__(self, config, head_dim: int, qkv_bias: bool) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=qkv_bias)
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=False)
        self.attn = Attention(self.num_heads, self.num_kv_heads, head_dim, head_dim**-0.5)

    def forward(self, x, positions, rotary: RotaryEmbedding, meta: AttentionMetadata):
        qkv = self.qkv_proj.forward(x)
        rotary.rotate_(positions, qkv, self.num_heads + self.num_kv_heads, self.head_dim)
        qs, ks = self.q_size, self.kv_size  # slices, not Tensor.split (a Python wrapper) on the hot path
        q, k, v = qkv[:, :qs], qkv[:, qs : qs + ks], qkv[:, qs + ks :]
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        o = self.attn.forward(q, k, v, meta)
        return self.o_proj.forward(o.reshape(-1, self.q_size))


class LlamaMLP(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.intermediate = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, 2 * self.intermediate, bias=False)
        self.down_proj = Linear(self.intermediate, config.hidden_size, bias=False)

    def forward(self, x):
        gate_up = self.gate_up_proj.forward(x)
        gate, up = gate_up[:, : self.intermediate], gate_up[:, self.intermediate :]
        return self.down_proj.forward(F.silu(gate).mul_(up))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config, head_dim: int, qkv_bias: bool) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, head_dim, qkv_bias)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, x, residual, positions, rotary, meta):
        """``x``: the previous sublayer's output (the embeddings for the first layer), not yet
        added to ``residual`` (None for the first layer). Returns the same pair for the next layer."""
        x, residual = self.input_layernorm.forward(x, residual)
        x = self.self_attn.forward(x, positions, rotary, meta)
        x, residual = self.post_attention_layernorm.forward(x, residual)
        return self.mlp.forward(x), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, config, max_positions: int, qkv_bias: bool = False) -> None:
        super().__init__()
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported activation {config.hidden_act!r} (Llama-family models use silu)")
        self.config = config
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            [LlamaDecoderLayer(config, self.head_dim, qkv_bias) for _ in range(config.num_hidden_layers)]
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config, self.head_dim, max_positions)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if getattr(config, "tie_word_embeddings", False):
            self.lm_head.weight = self.embed_tokens.weight

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.layers]

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Logits only for ``logits_indices``: the tokens whose next token is sampled."""
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer.forward(x, residual, positions, self.rotary, meta)
        x, _ = self.norm.forward(x[logits_indices], residual[logits_indices])
        return self.lm_head.forward(x).float()
