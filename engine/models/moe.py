"""Mixture-of-experts feed-forward: a router picks ``top_k`` experts per token, each a gated
MLP, and the token's output is their weighted sum.

Routing follows HF exactly: softmax of the router logits in float32, ``torch.topk`` (so ties go
the way HF's do), then, where the family normalises (Mixtral always, Qwen3-MoE with
``norm_topk_prob``), division by the chosen weights' sum. The router is a plain float product
(F.linear, as HF computes it) rather than a packed Linear: a different summation order could
flip a near-tie and so the expert.

On CPU the step's (token, expert) pairs are grouped by expert, so each expert's weights are
read once per step however many tokens chose it, and experts no token chose are not read at
all; results are accumulated in expert order, as HF does. On CUDA (with triton) the grouped
products run as one fused kernel launch (``moe_triton.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.layers import activation


def route(logits: torch.Tensor, top_k: int, normalize: bool, weights_dtype: torch.dtype | None):
    """``(weights [T, k], expert ids [T, k])`` from router logits, as HF's routers compute them;
    ``weights_dtype`` None keeps float32 (Mixtral), else the weights are cast (Qwen3-MoE)."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights if weights_dtype is None else weights.to(weights_dtype)), ids


class Experts(nn.Module):
    """All experts' weights as two stacked tensors: ``gate_up`` [E, 2I, H] and ``down`` [E, H, I].
    ``names``: the checkpoint's per-expert tensor names for gate, up and down."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, names: tuple[str, str, str],
                 act: str = "silu") -> None:
        super().__init__()
        self.num_experts, self.intermediate, self.names = num_experts, intermediate, names
        self.gate_up = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down = nn.Parameter(torch.empty(num_experts, hidden, intermediate))
        self.act = activation(act)

    def checkpoint_entries(self, module_name: str, local: str) -> list[tuple[str, tuple]]:
        gate, up, down = self.names
        i = self.intermediate
        out: list[tuple[str, tuple]] = []
        for e in range(self.num_experts):
            if local == "gate_up":
                out.append((f"{module_name}.{e}.{gate}.weight", (e, slice(0, i))))
                out.append((f"{module_name}.{e}.{up}.weight", (e, slice(i, 2 * i))))
            else:
                out.append((f"{module_name}.{e}.{down}.weight", (e,)))
        return out

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and self.act is F.silu:
            from engine.models import moe_triton  # lazy: triton is the optional 'triton' extra

            if moe_triton.usable(x):
                return moe_triton.fused_moe(x, self.gate_up, self.down, weights, ids, self.act)
        return grouped_moe(x, self.gate_up, self.down, weights, ids, self.act)


def grouped_moe(x, gate_up, down, weights, ids, act) -> torch.Tensor:
    """The CPU path (and the reference): pairs sorted by expert, one product pair per expert hit.
    Within an expert, rows go in HF's order (by rank among the token's choices, then token).
    An id equal to the number of experts marks a pair another rank computes (expert
    parallelism, ``engine/parallel``): it sorts last and is skipped."""
    num_tokens = ids.shape[0]
    flat = ids.t().flatten()  # rank-major: pair r * T + t is token t's r-th choice
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=gate_up.shape[0]).tolist()
    tokens = order % num_tokens
    pair_weights = weights.t().flatten()[order]
    inter = down.shape[2]
    out = torch.zeros_like(x)
    start = 0
    for e, n in enumerate(counts[: gate_up.shape[0]]):
        if n == 0:
            continue
        rows = tokens[start : start + n]
        h = F.linear(x[rows], gate_up[e])
        h = act(h[:, :inter]) * h[:, inter:]
        y = F.linear(h, down[e]) * pair_weights[start : start + n, None]
        out.index_add_(0, rows, y.to(out.dtype))
        start += n
    return out


class SparseMoE(nn.Module):
    """Router (``gate``) plus experts; the HF module names are kept so checkpoints map by name."""

    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int, normalize: bool,
                 names: tuple[str, str, str], act: str = "silu", cast_weights: bool = True) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, num_experts, bias=False)
        self.experts = Experts(num_experts, hidden, intermediate, names, act)
        self.top_k, self.normalize, self.cast_weights = top_k, normalize, cast_weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.gate.weight)
        weights, ids = route(logits, self.top_k, self.normalize, logits.dtype if self.cast_weights else None)
        return self.experts.forward(x, weights, ids)
