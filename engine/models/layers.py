"""Building blocks the model families share: norms, rotary tables, attention over the paged
pool, gated MLPs. A family file composes these; what differs between families is kept to
constructor arguments (bias, q/k norms, window, activation, rotary fraction).

Submodules are called through ``.forward`` directly: ``Module.__call__`` (hook dispatch) cost
about 3 us a call, some 300 calls a step, and no hooks are used here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

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


class GemmaRMSNorm(RMSNorm):
    """Gemma's norm scales by ``1 + weight`` and rounds once, after the product, in float32.

    In float32 that is the plain kernel with ``1 + weight`` as its weight (one product either
    way), so that copy is kept; 16-bit models take the torch formulation, which rounds later."""

    _offset: tuple[int, int, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is not None:
            residual.add_(x)
            x = residual
        if x.dtype == torch.float32:
            key = (self.weight.data_ptr(), self.weight._version)
            if self._offset is None or self._offset[:2] != key:
                self._offset = (*key, (1.0 + self.weight.detach().float()).contiguous())
            shape = x.shape
            out, _ = fused.rms_norm(x.reshape(-1, shape[-1]).contiguous(), self._offset[2], self.eps)
            return out.view(shape), x
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype), x


def rope_parameters(config, layer_type: str | None = None) -> dict:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if layer_type is not None and layer_type in params:
        params = params[layer_type]
    return dict(params)


def inverse_frequencies(config, head_dim: int, layer_type: str | None = None, long: bool = False):
    """``(inv_freq, attention scaling)`` as HF's rotary module for this config computes them
    (``long``: longrope's long-context factors)."""
    params = rope_parameters(config, layer_type)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
        base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        return inv_freq, 1.0
    kwargs: dict = {} if layer_type is None else {"layer_type": layer_type}
    if long:
        kwargs["seq_len"] = params["original_max_position_embeddings"] + 1
    # device None: the current default, so building under ``torch.device("meta")`` stays on meta.
    return ROPE_INIT_FUNCTIONS[rope_type](config, None, **kwargs)


class RotaryEmbedding(nn.Module):
    """Cos/sin table for every position up to the context length, built once.

    ``rotary_dim`` may be less than the head size (Phi-4-mini rotates 3/4 of each head). For
    longrope (Phi-3), HF rotates a step's tokens with the long factors once the sequence
    passes the original context length; here the table switches at that position, which is
    the same for every decode step and for prompts within the original length (a prompt longer
    than that gets short factors for its first positions, where HF uses long ones throughout).
    """

    def __init__(self, config, head_dim: int, max_positions: int, layer_type: str | None = None) -> None:
        super().__init__()
        self.config, self.head_dim, self.max_positions, self.layer_type = config, head_dim, max_positions, layer_type
        self.build()

    def build(self) -> None:
        """(Re)compute the tables: the loader calls it after building the model on the meta device."""
        config, layer_type = self.config, self.layer_type
        inv_freq, scaling = inverse_frequencies(config, self.head_dim, layer_type)
        inv_freq = inv_freq.float()
        freqs = torch.outer(torch.arange(self.max_positions, dtype=torch.float32), inv_freq)
        params = rope_parameters(config, layer_type)
        if params.get("rope_type", params.get("type")) == "longrope":
            switch = params["original_max_position_embeddings"]
            long_inv, _ = inverse_frequencies(config, self.head_dim, layer_type, long=True)
            if self.max_positions > switch:
                freqs[switch:] = torch.outer(torch.arange(switch, self.max_positions, dtype=torch.float32),
                                             long_inv.float())
        emb = torch.cat((freqs, freqs), dim=-1)
        self.rotary_dim = emb.shape[-1]
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
        if self.rotary_dim == head_dim:
            fused.rotary_(qkv, num_heads, head_dim, positions, self.cos, self.sin)
            return
        heads = qkv[:, : num_heads * head_dim].view(-1, num_heads, head_dim)[..., : self.rotary_dim]
        cos = self.cos[positions].to(qkv.dtype).unsqueeze(1)
        sin = self.sin[positions].to(qkv.dtype).unsqueeze(1)
        heads.copy_(fused.rotary_reference(heads, cos, sin))


def fused_linear(in_features: int, shards: list[tuple[str, int]], bias: bool) -> Linear:
    """One Linear for several checkpoint tensors stacked along the output (q/k/v, gate/up):
    ``shards`` names each checkpoint tensor and its size, in order, for the loader."""
    layer = Linear(in_features, sum(size for _, size in shards), bias=bias)
    layer.shards = shards
    return layer


class SelfAttention(nn.Module):
    """Fused qkv projection, optional per-head q/k norms, rotary, paged attention, output
    projection. ``window``: how many positions (the token's own included) a query sees, or None."""

    def __init__(
        self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, *, qkv_bias: bool = False,
        fused_checkpoint: bool = False, scale: float | None = None, window: int | None = None,
        qk_norm: type[RMSNorm] | None = None, norm_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_size = num_heads * head_dim
        self.kv_size = num_kv_heads * head_dim
        out = self.q_size + 2 * self.kv_size
        if fused_checkpoint:  # the checkpoint stores qkv_proj itself (Phi-3)
            self.qkv_proj = Linear(hidden_size, out, bias=qkv_bias)
        else:
            shards = [("q_proj", self.q_size), ("k_proj", self.kv_size), ("v_proj", self.kv_size)]
            self.qkv_proj = fused_linear(hidden_size, shards, qkv_bias)
        self.o_proj = Linear(self.q_size, hidden_size, bias=False)
        self.q_norm = qk_norm(head_dim, norm_eps) if qk_norm is not None else None
        self.k_norm = qk_norm(head_dim, norm_eps) if qk_norm is not None else None
        self.attn = Attention(num_heads, num_kv_heads, head_dim, head_dim**-0.5 if scale is None else scale,
                              window=window)

    def _norm_heads(self, qkv: torch.Tensor) -> None:
        """Per-head RMSNorm of the q and k heads (Qwen3, Gemma 3), before rotary, in place."""
        qs, ks = self.q_size, self.kv_size
        q, _ = self.q_norm.forward(qkv[:, :qs].reshape(-1, self.head_dim))
        k, _ = self.k_norm.forward(qkv[:, qs : qs + ks].reshape(-1, self.head_dim))
        qkv[:, :qs] = q.view(-1, qs)
        qkv[:, qs : qs + ks] = k.view(-1, ks)

    def forward(self, x, positions, rotary: RotaryEmbedding, meta: AttentionMetadata):
        qkv = self.qkv_proj.forward(x)
        if self.q_norm is not None:
            self._norm_heads(qkv)
        rotary.rotate_(positions, qkv, self.num_heads + self.num_kv_heads, self.head_dim)
        qs, ks = self.q_size, self.kv_size  # slices, not Tensor.split (a Python wrapper) on the hot path
        q, k, v = qkv[:, :qs], qkv[:, qs : qs + ks], qkv[:, qs + ks :]
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        o = self.attn.forward(q, k, v, meta)
        return self.o_proj.forward(o.reshape(-1, self.q_size))


ACTIVATIONS = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported activation {name!r} (supported: {', '.join(sorted(ACTIVATIONS))})")
    return ACTIVATIONS[name]


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` with gate and up as one product."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str = "silu",
                 fused_checkpoint: bool = False) -> None:
        super().__init__()
        self.intermediate = intermediate_size
        if fused_checkpoint:  # the checkpoint stores gate_up_proj itself (Phi-3)
            self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias=False)
        else:
            shards = [("gate_proj", intermediate_size), ("up_proj", intermediate_size)]
            self.gate_up_proj = fused_linear(hidden_size, shards, False)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False)
        self.act_name, self.act = act, activation(act)

    def forward(self, x):
        gate_up = self.gate_up_proj.forward(x)
        return self.down_proj.forward(fused.act_and_mul(gate_up, self.intermediate, self.act_name, self.act))
