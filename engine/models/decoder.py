"""The decoder-only causal LM every family builds on: embeddings, a stack of layers, a final
norm, the LM head, over flat token batches (no batch dimension: a step is ``T`` tokens from
many sequences, and attention reaches each sequence's history through the paged KV pool).

A family supplies its layers (``build_layer``) and, where it differs, the embedding scale, the
rotary table each layer uses and the final logit soft-cap. ``checkpoint_layout`` tells the
loader which checkpoint tensor fills which parameter (or which slice of a fused one).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.attention import Attention, AttentionMetadata
from engine.models.layers import GatedMLP, RMSNorm, RotaryEmbedding, SelfAttention
from engine.models.linear import Linear


def layer_windows(config, max_positions: int) -> list[int | None]:
    """Each layer's sliding window as HF applies it (None: full attention). ``layer_types``
    names the sliding layers where the config has it (Gemma 3, Qwen2/3); otherwise a set
    ``sliding_window`` applies to every layer (Mistral, Mixtral, Phi-3). A window at least as
    long as the context changes nothing and is dropped."""
    n = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    if not window or window >= max_positions:
        return [None] * n
    types = getattr(config, "layer_types", None)
    if types:
        return [window if t == "sliding_attention" else None for t in types]
    if getattr(config, "use_sliding_window", True) is False:
        return [None] * n
    return [window] * n


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class PreNormLayer(nn.Module):
    """Llama-style layer: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``, the residual adds
    fused into the norms."""

    def __init__(self, config, attn: SelfAttention, mlp: nn.Module, norm: type[RMSNorm] = RMSNorm) -> None:
        super().__init__()
        self.input_layernorm = norm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = attn
        self.post_attention_layernorm = norm(config.hidden_size, config.rms_norm_eps)
        self.mlp = mlp

    def forward(self, x, residual, positions, rotary, meta):
        """``x``: the previous sublayer's output (the embeddings for the first layer), not yet
        added to ``residual`` (None for the first layer). Returns the same pair for the next layer."""
        x, residual = self.input_layernorm.forward(x, residual)
        x = self.self_attn.forward(x, positions, rotary, meta)
        x, residual = self.post_attention_layernorm.forward(x, residual)
        return self.mlp.forward(x), residual


class CausalLM(nn.Module):
    """Base of every family. ``model(input_ids, positions, meta, logits_indices)`` returns
    float32 logits for ``logits_indices`` only (the tokens whose next token is sampled)."""

    embed_scale: float | None = None
    final_logit_softcapping: float | None = None

    def __init__(self, config, max_positions: int, **options) -> None:
        super().__init__()
        self.config = config
        self.head_dim = head_dim_of(config)
        self.windows = layer_windows(config, max_positions)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([self.build_layer(config, i, **options) for i in range(config.num_hidden_layers)])
        self.norm = self.norm_class(config.hidden_size, config.rms_norm_eps)
        self.build_rotary(config, max_positions)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    norm_class: type[RMSNorm] = RMSNorm

    @classmethod
    def options_from_checkpoint(cls, config, names: set[str]) -> dict:
        """Constructor options read off the checkpoint's tensor names (e.g. whether q/k/v have biases)."""
        return {}

    def build_layer(self, config, index: int, **options) -> nn.Module:
        raise NotImplementedError

    def build_rotary(self, config, max_positions: int) -> None:
        """The rotary tables the layers use (``rotary_for``): one, unless the family overrides."""
        self.rotary = RotaryEmbedding(config, self.head_dim, max_positions)

    def tie_weights(self) -> None:
        """Share the embedding as the LM head where the config ties them (again after
        ``to_empty``, which gives each module its own tensor)."""
        if getattr(self.config, "tie_word_embeddings", False):
            self.lm_head.weight = self.embed_tokens.weight

    def llama_attention(self, config, index: int, **kwargs) -> SelfAttention:
        return SelfAttention(config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                             self.head_dim, window=self.windows[index], norm_eps=config.rms_norm_eps, **kwargs)

    def llama_mlp(self, config, act: str | None = None, **kwargs) -> GatedMLP:
        act = act or getattr(config, "hidden_act", "silu")
        return GatedMLP(config.hidden_size, config.intermediate_size, act, **kwargs)

    @property
    def kv_window(self) -> int | None:
        """How far back any layer still reads a sequence's keys: the widest window when every
        layer has one, else None. The block manager gives back blocks older than that."""
        if not self.windows or any(w is None for w in self.windows):
            return None
        return max(self.windows)

    def rotary_for(self, index: int) -> RotaryEmbedding:
        return self.rotary

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.layers]

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        x, residual = self.hidden_states(input_ids, positions, meta)
        return self.logits(x, residual, logits_indices)

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata):
        """The layers: ``(x, residual)`` of the last one, every token. Apart from ``logits`` so a
        CUDA graph can hold the layers while the LM head runs on however many rows sample."""
        x, residual = self.embed_tokens(input_ids), None
        if self.embed_scale is not None:  # HF rounds the scale to the weights' dtype first
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        for i, layer in enumerate(self.layers):
            x, residual = layer.forward(x, residual, positions, self.rotary_for(i), meta)
        return x, residual

    # False (the CUDA model runner): logits stay in the LM head's dtype unless softcapped, and
    # the sampler widens them only for rows that draw; a greedy step's argmax reads the bfloat16
    # values, the same values float32 would hold, without a [rows, vocab] float32 copy.
    float_logits = True

    def logits(self, x: torch.Tensor, residual: torch.Tensor, logits_indices: torch.Tensor) -> torch.Tensor:
        """Logits of the rows ``logits_indices`` picks (the final norm and the LM head): float32,
        or with ``float_logits`` off the LM head's dtype."""
        x, _ = self.norm.forward(x[logits_indices], residual[logits_indices])
        logits = self.lm_head.forward(x)
        if self.final_logit_softcapping:
            cap = self.final_logit_softcapping
            logits = torch.tanh(logits.float() / cap) * cap
        elif self.float_logits:
            logits = logits.float()
        return logits

    # ---- checkpoint ------------------------------------------------------------------
    @staticmethod
    def checkpoint_name(name: str) -> str:
        return name if name.startswith("lm_head.") else f"model.{name}"

    def checkpoint_layout(self) -> dict[str, tuple[str, tuple]]:
        """Every tensor the checkpoint must hold: HF name -> (our parameter, index into it).
        A fused Linear (``shards``) takes one slice per checkpoint tensor; a module with
        ``checkpoint_entries`` (the experts of a MoE layer) names its own. A tied LM head is
        the embedding's parameter and not expected again."""
        layout: dict[str, tuple[str, tuple]] = {}
        seen: set[int] = set()
        for mname, module in self.named_modules():
            for local, param in module.named_parameters(recurse=False):
                if id(param) in seen:
                    continue
                seen.add(id(param))
                full = f"{mname}.{local}" if mname else local
                parent = mname.rsplit(".", 1)[0] if "." in mname else ""
                shards = getattr(module, "shards", None)
                if hasattr(module, "checkpoint_entries"):
                    for name, index in module.checkpoint_entries(mname, local):
                        layout[self.checkpoint_name(name)] = (full, index)
                elif shards:
                    offset = 0
                    for hf_module, size in shards:
                        layout[self.checkpoint_name(f"{parent}.{hf_module}.{local}")] = (
                            full, (slice(offset, offset + size),))
                        offset += size
                else:
                    layout[self.checkpoint_name(full)] = (full, ())
        return layout
