"""The modules a sharded model swaps in: each wraps the rank's slice of a layer and adds the
collective that makes its output whole again (``shard.py`` cuts the slices).

Column-parallel products (q/k/v, gate/up) need no wrapper: a rank's heads and intermediate
features are complete on their own. Row-parallel ones (o, down) give partial sums, added by
one all-reduce each; the vocabulary-split embedding and LM head need one collective each.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.linear import Linear
from engine.models.moe import Experts, grouped_moe
from engine.parallel.group import ParallelGroup


class RowParallel(nn.Module):
    """A rank's columns of a product's weight times its slice of the input: the ranks' partial
    sums are added by an all-reduce (the bias, if any, is kept by rank 0 alone)."""

    def __init__(self, inner: Linear, group: ParallelGroup) -> None:
        super().__init__()
        self.inner, self.group = inner, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(self.inner.forward(x))


class VocabParallelEmbedding(nn.Module):
    """A rank's rows ``start .. start + rows`` of the embedding table: ids outside them look up
    zeros, and an all-reduce gives every rank every token's row."""

    def __init__(self, weight: torch.Tensor, start: int, group: ParallelGroup) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.start, self.group = start, group

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        mine = (local >= 0) & (local < self.weight.shape[0])
        x = F.embedding(torch.where(mine, local, 0), self.weight)
        x = x * mine.unsqueeze(-1).to(x.dtype)
        return self.group.all_reduce(x)


class VocabParallelLMHead(nn.Module):
    """A rank's vocabulary rows of the LM head: its logits, gathered from every rank in rank
    order and cut to ``vocab_size`` (the last rank's padding rows dropped)."""

    def __init__(self, inner: Linear, vocab_size: int, group: ParallelGroup) -> None:
        super().__init__()
        self.inner, self.vocab_size, self.group = inner, vocab_size, group

    @property
    def weight(self) -> torch.Tensor:
        return self.inner.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_gather_last(self.inner.forward(x))[..., : self.vocab_size]


class LocalExperts(nn.Module):
    """Expert parallelism: a rank holds experts ``first .. first + count`` whole. The router
    runs on every rank (same input, same choices); a rank computes the pairs of its own experts
    and the all-reduce adds the ranks' sums."""

    def __init__(self, inner: Experts, first: int, group: ParallelGroup) -> None:
        super().__init__()
        self.inner, self.first, self.group = inner, first, group

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        count = self.inner.gate_up.shape[0]
        local = ids - self.first
        mine = (local >= 0) & (local < count)
        # Another rank's pairs go to expert ``count``, which grouped_moe skips.
        local = torch.where(mine, local, count)
        out = grouped_moe(x, self.inner.gate_up, self.inner.down, weights, local, self.inner.act)
        return self.group.all_reduce(out)
