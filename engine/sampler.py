"""Turns the logits of a step into next tokens, each request with its own settings and noise.

Temperature, top-k and top-p are whole-batch tensor ops (one sort serves both filters); the draw
is the exponential race (``argmax(p / E)`` with ``E ~ Exp(1)``), one noise vector per row. A
request's noise never depends on which other requests share its batch, so a seed reproduces the
same tokens in any batch. Where it comes from depends on the device:

* CPU: each non-greedy request owns a ``torch.Generator`` (the native generator is faster there
  than hashing the vocabulary); one call per row fills its noise.
* GPU: one generator per row would be one launch per row, so the noise is counter-based, a hash
  of (seed, position, token id) for the whole batch at once (``exponential_noise``); the step's
  tokens never leave the device.
"""

from __future__ import annotations

import torch

from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

_MASK32 = 0xFFFFFFFF


def make_generator(seed: int) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


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


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                       k_max: int | None = None) -> torch.Tensor:
    """Rows keep their ``top_k`` largest logits (0: all), then the smallest set of those whose
    renormalised probability reaches ``top_p`` (as vLLM and HF order them); the rest become -inf.
    Ties at a cut-off are kept. ``k_max``: every row's top-k is at most this (set by the caller
    from the host's parameters), so only that many columns need sorting, not the vocabulary."""
    vocab = logits.shape[-1]
    if k_max is not None and k_max < vocab:
        sorted_logits = torch.topk(logits, k_max, dim=-1).values  # sorted, largest first
    else:
        sorted_logits = torch.sort(logits, dim=-1, descending=True).values  # one sort serves both filters
    width = sorted_logits.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=width), torch.full_like(top_k, width))
    ranks = torch.arange(width, device=logits.device)
    outside_k = ranks[None, :] >= k[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(outside_k, float("-inf")), dim=-1)
    outside = (probs.cumsum(-1) - probs > top_p[:, None]) | outside_k
    # the smallest logit both filters keep is the row's cut-off (rank 0 is always kept)
    cut = torch.where(outside, torch.full_like(sorted_logits, float("inf")), sorted_logits).amin(-1)
    return logits.masked_fill(logits < cut[:, None], float("-inf"))


def _probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Each row's sampling distribution after its temperature, top-k and top-p (greedy rows: any)."""
    rows = [(p.temperature if not p.greedy else 1.0, p.top_p, p.top_k) for p in params]
    settings = torch.tensor(rows, dtype=torch.float32)
    if logits.is_cuda:
        settings = settings.pin_memory().to(logits.device, non_blocking=True)
    scaled = logits / settings[:, 0:1]
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):  # decided on the host: no device sync
        k_max = max(p.top_k for p in params) if all(p.top_k > 0 for p in params) else None
        scaled = filter_top_k_top_p(scaled, settings[:, 2].to(torch.int64), settings[:, 1], k_max)
    return torch.softmax(scaled, dim=-1)


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> torch.Tensor:
    """CPU: ``logits`` [N, vocab] float32, one row per request that samples this step; the
    token ids as an int64 tensor."""
    out = logits.argmax(dim=-1)
    drawn = [i for i, p in enumerate(params) if not p.greedy]
    if drawn:
        probs = _probs(logits[drawn], [params[i] for i in drawn])
        noise = torch.empty_like(probs)
        for row, i in enumerate(drawn):
            noise[row].exponential_(1.0, generator=generators[i])
        out[drawn] = torch.argmax(probs / noise, dim=-1)
    return out


def seed_of(seq: Sequence) -> int:
    """The sequence's sampling seed (its generator's), so each sample keeps its own stream."""
    return seq.generator.initial_seed() if seq.generator is not None else 0


def sample_on_device(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """GPU: next token ids (int64, where the logits are) with counter-based noise."""
    greedy_ids = logits.argmax(dim=-1)
    if all(s.params.greedy for s in seqs):
        return greedy_ids
    meta = torch.tensor([[seed_of(s), s.num_tokens, s.params.greedy] for s in seqs], dtype=torch.int64)
    if logits.is_cuda:
        meta = meta.pin_memory().to(logits.device, non_blocking=True)
    probs = _probs(logits, [s.params for s in seqs])
    drawn = torch.argmax(probs / exponential_noise(meta[:, 0], meta[:, 1], logits.shape[-1]), dim=-1)
    return torch.where(meta[:, 2].bool(), greedy_ids, drawn)
