"""Sampling as whole-batch tensor ops where the logits are (the GPU): temperature, top-k, top-p and
seeds, with no loop over rows and no ``[rows, vocab]`` copy to the host.

A request's noise must not depend on which others share its batch, and one generator per row
would mean one kernel launch per row. So the noise is counter-based: the exponential variate for
(seed, position, token) is a hash of the three, computed for the whole batch at once. A seed
and position give the same draw on any device and in any batch; it is a different stream from
the CPU sampler's ``torch.Generator`` (``engine/sampler.py``), which the CPU keeps because its
native generator is faster there than hashing the vocabulary.
"""

from __future__ import annotations

import torch

from engine.sequence import Sequence

_MASK32 = 0xFFFFFFFF


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser on int64 tensors holding values in [0, 2**32)."""
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _MASK32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _MASK32
    return h ^ (h >> 16)


def exponential_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[rows, vocab]`` Exp(1) variates, a pure function of (seed, position, token id)."""
    row = _fmix32(_fmix32((seeds & _MASK32) ^ _fmix32((seeds >> 32) & _MASK32)) ^ (positions & _MASK32))
    tokens = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    h = _fmix32((row[:, None] + tokens * 0x9E3779B9) & _MASK32)
    uniform = ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # in (0, 1), never 0
    return -torch.log(uniform)


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Rows keep their ``top_k`` largest logits (0: all) and the smallest set whose probability
    mass reaches ``top_p``; the rest become -inf. Ties at a cut-off are kept."""
    vocab = logits.shape[-1]
    sorted_logits = torch.sort(logits, dim=-1, descending=True).values  # one sort serves both filters
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    probs = torch.softmax(sorted_logits, dim=-1)
    ranks = torch.arange(vocab, device=logits.device)
    outside = (probs.cumsum(-1) - probs > top_p[:, None]) | (ranks[None, :] >= k[:, None])
    # the smallest logit both filters keep is the row's cut-off (rank 0 is always kept)
    cut = torch.where(outside, torch.full_like(sorted_logits, float("inf")), sorted_logits).amin(-1)
    return logits.masked_fill(logits < cut[:, None], float("-inf"))


def seed_of(seq: Sequence) -> int:
    """The sequence's sampling seed (its generator's), so each sample keeps its own stream."""
    return seq.generator.initial_seed() if seq.generator is not None else 0


def sample_on_device(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Next token ids (int64, on the logits' device) for rows of float32 logits."""
    greedy_ids = logits.argmax(dim=-1)
    if all(s.params.greedy for s in seqs):
        return greedy_ids
    dev = logits.device
    params = [s.params for s in seqs]
    host = torch.tensor([[p.temperature if not p.greedy else 1.0, p.top_p, p.top_k, p.greedy]
                         for p in params], dtype=torch.float64)
    meta = torch.tensor([[seed_of(s), s.num_tokens] for s in seqs], dtype=torch.int64)
    if dev.type == "cuda":
        host, meta = host.pin_memory().to(dev, non_blocking=True), meta.pin_memory().to(dev, non_blocking=True)
    temperature, top_p = host[:, 0].to(torch.float32), host[:, 1].to(torch.float32)
    top_k, greedy = host[:, 2].to(torch.int64), host[:, 3].bool()
    scaled = logits / temperature[:, None]
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):  # decided on the host: no device sync
        scaled = filter_top_k_top_p(scaled, top_k, top_p)
    probs = torch.softmax(scaled, dim=-1)
    drawn = torch.argmax(probs / exponential_noise(meta[:, 0], meta[:, 1], logits.shape[-1]), dim=-1)
    return torch.where(greedy.to(dev), greedy_ids, drawn)
