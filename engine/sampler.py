"""Turns the logits of a step into next tokens, each request with its own settings and RNG.

Every non-greedy request owns a ``torch.Generator``; its noise never depends on which
other requests share the batch, so a seed reproduces the same tokens in any batch.
Sampling uses the exponential-race form of the categorical draw
(``argmax(p / E)`` with ``E ~ Exp(1)``), one noise vector per request.
"""

from __future__ import annotations

import torch

from engine.sampling_params import SamplingParams


def make_generator(seed: int) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


def _filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        cumulative = probs.cumsum(-1)
        remove = cumulative - probs > top_p  # keep the smallest set whose mass reaches top_p
        sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(0, order, sorted_logits)
    return logits


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int]:
    """``logits``: [N, vocab] float32, one row per request that samples this step."""
    greedy = logits.argmax(dim=-1).tolist()
    out = list(greedy)
    for i, p in enumerate(params):
        if p.greedy:
            continue
        row = logits[i] / p.temperature
        row = _filter_top_k_top_p(row, p.top_k, p.top_p)
        probs = torch.softmax(row, dim=-1)
        noise = torch.empty_like(probs).exponential_(1.0, generator=generators[i])
        out[i] = int(torch.argmax(probs / noise))
    return out
