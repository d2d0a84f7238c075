"""Cut a loaded model (on the CPU, before packing and before it moves to its device) down to
one rank's part, in place.

- attention: the rank's query heads and their KV heads (column-parallel q/k/v), the matching
  columns of ``o_proj`` (row-parallel). With fewer KV heads than ranks each KV head is copied to
  the ranks whose query heads read it (Gemma 3 270M has one).
- gated MLPs: the rank's intermediate features of gate and up, those columns of ``down_proj``.
- MoE layers: the rank's experts whole, the router everywhere.
- embedding and LM head: the rank's vocabulary rows (a tied head stays tied).
Norms, rotary tables and routers are kept whole on every rank.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.models.layers import GatedMLP, SelfAttention
from engine.models.linear import Linear
from engine.models.moe import SparseMoE
from engine.parallel.group import ParallelGroup
from engine.parallel.layers import LocalExperts, RowParallel, VocabParallelEmbedding, VocabParallelLMHead


def check_shardable(config, world_size: int) -> None:
    """One clear error before any process starts where the model's shapes do not split."""
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    problems = []
    if heads % world_size:
        problems.append(f"{heads} attention heads")
    if kv % world_size and world_size % kv:
        problems.append(f"{kv} KV heads (neither a multiple nor a divisor of the ranks)")
    for name in ("intermediate_size", "moe_intermediate_size"):
        size = getattr(config, name, None)
        if size and size % world_size:
            problems.append(f"{name} {size}")
    if problems:
        raise ValueError(f"tensor_parallel_size {world_size} does not divide the model's {', '.join(problems)}")


def _plain_linear(module: nn.Module, where: str) -> Linear:
    if type(module) not in (Linear, nn.Linear):
        raise ValueError(f"tensor parallelism does not take {type(module).__name__} layers yet ({where})")
    return module


def _set_rows(linear: Linear, rows: torch.Tensor) -> None:
    """Keep these output rows (indices into the weight's first axis)."""
    linear.weight = nn.Parameter(linear.weight.data[rows].contiguous(), requires_grad=False)
    if linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias.data[rows].contiguous(), requires_grad=False)
    linear.out_features = len(rows)


def _set_columns(linear: Linear, start: int, count: int, keep_bias: bool) -> None:
    linear.weight = nn.Parameter(linear.weight.data[:, start : start + count].contiguous(), requires_grad=False)
    if linear.bias is not None and not keep_bias:
        linear.bias = None
    linear.in_features = count


def _shard_attention(attn: SelfAttention, group: ParallelGroup, where: str) -> None:
    r, n, d = group.rank, group.world_size, attn.head_dim
    heads, kv = attn.num_heads // n, max(attn.num_kv_heads // n, 1)
    first_kv = r * attn.num_kv_heads // n  # replicated KV heads: the one this rank's queries read
    q_rows = torch.arange(r * heads * d, (r + 1) * heads * d)
    k_rows = attn.q_size + torch.arange(first_kv * d, (first_kv + kv) * d)
    v_rows = k_rows + attn.kv_size
    _set_rows(_plain_linear(attn.qkv_proj, f"{where}.qkv_proj"), torch.cat([q_rows, k_rows, v_rows]))
    o = _plain_linear(attn.o_proj, f"{where}.o_proj")
    _set_columns(o, r * heads * d, heads * d, keep_bias=r == 0)
    attn.o_proj = RowParallel(o, group)
    attn.num_heads, attn.num_kv_heads = heads, kv
    attn.q_size, attn.kv_size = heads * d, kv * d
    attn.attn.num_heads, attn.attn.num_kv_heads = heads, kv


def _shard_mlp(mlp: GatedMLP, group: ParallelGroup, where: str) -> None:
    r, n, full = group.rank, group.world_size, mlp.intermediate
    part = full // n
    rows = torch.arange(r * part, (r + 1) * part)
    _set_rows(_plain_linear(mlp.gate_up_proj, f"{where}.gate_up_proj"), torch.cat([rows, full + rows]))
    down = _plain_linear(mlp.down_proj, f"{where}.down_proj")
    _set_columns(down, r * part, part, keep_bias=r == 0)
    mlp.down_proj = RowParallel(down, group)
    mlp.intermediate = part


def _shard_moe(moe: SparseMoE, group: ParallelGroup) -> None:
    experts = moe.experts
    total = experts.num_experts
    first, end = group.rank * total // group.world_size, (group.rank + 1) * total // group.world_size
    experts.gate_up = nn.Parameter(experts.gate_up.data[first:end].contiguous(), requires_grad=False)
    experts.down = nn.Parameter(experts.down.data[first:end].contiguous(), requires_grad=False)
    experts.num_experts = end - first
    moe.experts = LocalExperts(experts, first, group)


def _shard_vocab(model: nn.Module, group: ParallelGroup) -> None:
    vocab = model.embed_tokens.weight.shape[0]
    rows = -(-vocab // group.world_size)
    start = group.rank * rows
    tied = model.lm_head.weight is model.embed_tokens.weight

    def cut(weight: torch.Tensor) -> torch.Tensor:
        part = weight.data[start : start + rows]
        if part.shape[0] < rows:  # the last rank pads its rows with zeros
            part = torch.cat([part, part.new_zeros(rows - part.shape[0], part.shape[1])])
        return part.contiguous()

    model.embed_tokens = VocabParallelEmbedding(cut(model.embed_tokens.weight), start, group)
    head = _plain_linear(model.lm_head, "lm_head")
    if tied:
        head.weight = model.embed_tokens.weight
    else:
        head.weight = nn.Parameter(cut(head.weight), requires_grad=False)
    head.out_features = rows
    model.lm_head = VocabParallelLMHead(head, vocab, group)


def shard_model(model: nn.Module, group: ParallelGroup) -> nn.Module:
    """``model`` reduced to rank ``group.rank``'s part (the same object, changed in place)."""
    check_shardable(model.config, group.world_size)
    for name, module in list(model.named_modules()):
        if isinstance(module, SelfAttention):
            _shard_attention(module, group, name)
        elif isinstance(module, GatedMLP):
            _shard_mlp(module, group, name)
        elif isinstance(module, SparseMoE):
            _shard_moe(module, group)
    _shard_vocab(model, group)
    return model
