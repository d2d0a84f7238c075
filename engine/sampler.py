"""Turns the logits of a step into next tokens, each request with its own settings and seed.

Temperature, top-k and top-p are whole-batch tensor ops (one sort serves both filters). A row
that samples takes the token where its cumulative probability passes one uniform number
(inverse transform sampling: one ``cumsum`` and one ``searchsorted`` for the whole batch). The
number is a hash of (seed, position) computed on the host with the row's settings, so a step's
sampling inputs are one small array and one copy; no per-row generator call, no ``[rows, vocab]``
noise. A draw is a pure function of (seed, position, distribution): a seed gives the same tokens
in any batch, after a preemption, and on the CPU and the GPU alike (up to the last bits of their
softmax). On the GPU the tokens never leave the device.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

_MASK32 = np.uint64(0xFFFFFFFF)


def _fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finaliser on uint64 arrays holding values in [0, 2**32)."""
    h = h ^ (h >> np.uint64(16))
    h = (h * np.uint64(0x85EBCA6B)) & _MASK32
    h = h ^ (h >> np.uint64(13))
    h = (h * np.uint64(0xC2B2AE35)) & _MASK32
    return h ^ (h >> np.uint64(16))


def uniform_draws(seeds: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """One float32 per row, a pure function of (seed, position): an odd multiple of 2**-24, so
    exactly representable and strictly inside (0, 1)."""
    seeds, positions = np.asarray(seeds, np.uint64), np.asarray(positions, np.uint64)
    h = _fmix32(_fmix32((seeds & _MASK32) ^ _fmix32(seeds >> np.uint64(32))) ^ (positions & _MASK32))
    h = _fmix32((h + np.uint64(0x9E3779B9)) & _MASK32)
    return ((h >> np.uint64(9)) * 2 + 1).astype(np.float32) * np.float32(2.0**-24)


NUMPY_TOP_K_MAX_VOCAB = 4096  # numpy's partition beats torch.topk on the CPU up to about here


def _sorted_descending(logits: torch.Tensor, k_max: int | None) -> torch.Tensor:
    """Each row's ``k_max`` largest values (all if None), largest first. Only values are needed;
    on the CPU numpy's sort is 4-30x faster than ``torch.sort``, and its partition faster than
    ``torch.topk`` for small vocabularies (``bench/sampler_sort.py``)."""
    vocab = logits.shape[-1]
    k = k_max if k_max is not None and k_max < vocab else None
    if logits.device.type != "cpu" or (k and vocab > NUMPY_TOP_K_MAX_VOCAB):
        return torch.topk(logits, k, dim=-1).values if k else torch.sort(logits, dim=-1, descending=True).values
    values = logits.detach().contiguous().numpy()
    if k:
        values = np.partition(values, vocab - k, axis=-1)[:, vocab - k :]
    return torch.from_numpy(np.ascontiguousarray(np.sort(values, axis=-1)[:, ::-1]))


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                       k_max: int | None = None) -> torch.Tensor:
    """Rows keep their ``top_k`` largest logits (0: all), then the smallest set of those whose
    renormalised probability reaches ``top_p`` (as vLLM and HF order them); the rest become -inf.
    Ties at a cut-off are kept. ``k_max``: every row's top-k is at most this (set by the caller
    from the host's parameters), so only that many columns need sorting, not the vocabulary."""
    sorted_logits = _sorted_descending(logits, k_max)
    width = sorted_logits.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=width), torch.full_like(top_k, width))
    ranks = torch.arange(width, device=logits.device)
    outside_k = ranks[None, :] >= k[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(outside_k, float("-inf")), dim=-1)
    # a row with top_p 1 keeps all (its float sums can pass 1.0 before the end)
    outside = ((probs.cumsum(-1) - probs > top_p[:, None]) & (top_p < 1.0)[:, None]) | outside_k
    # the smallest logit both filters keep is the row's cut-off (rank 0 is always kept)
    cut = torch.where(outside, torch.full_like(sorted_logits, float("inf")), sorted_logits).amin(-1)
    return logits.masked_fill(logits < cut[:, None], float("-inf"))


def _probs(logits: torch.Tensor, settings: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Each row's sampling distribution after its temperature, top-k and top-p; ``settings`` holds
    them per row (columns 1-3 of ``sample``'s array), ``params`` decide on the host which filters run."""
    scaled = logits / settings[:, 1:2]
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):  # decided on the host: no device sync
        k_max = max(p.top_k for p in params) if all(p.top_k > 0 for p in params) else None
        scaled = filter_top_k_top_p(scaled, settings[:, 3].to(torch.int64), settings[:, 2], k_max)
    return torch.softmax(scaled, dim=-1)


def draw(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Per row, the first token whose cumulative probability exceeds ``uniform`` times the row's
    total: a token of zero probability is never drawn, however the float sums round."""
    cdf = probs.cumsum(dim=-1)
    if cdf.is_cuda:  # a one-row scan may sum in another order: keep it flat at zeros and monotone
        cdf = torch.where(probs > 0, cdf, 0.0).cummax(dim=-1).values
    total = cdf[:, -1:]
    target = torch.minimum(uniform[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(1)
    # a row without a finite distribution (NaN logits) falls past the end: it takes its argmax
    return torch.where(tokens < probs.shape[-1], tokens, probs.argmax(dim=-1))


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Next token ids (int64, on the logits' device) for ``logits`` [N, vocab] float32, one row per
    sequence that samples this step; greedy rows take the argmax."""
    out = logits.argmax(dim=-1)
    drawn = [i for i, s in enumerate(seqs) if not s.params.greedy]
    if not drawn:
        return out
    n = len(drawn)
    params = [seqs[i].params for i in drawn]
    host = np.empty((n, 5), np.float32)  # uniform, temperature, top-p, top-k, row: one copy
    host[:, 0] = uniform_draws(np.fromiter((seqs[i].seed or 0 for i in drawn), np.uint64, n),
                               np.fromiter((seqs[i].num_tokens for i in drawn), np.uint64, n))
    host[:, 1:4] = [(p.temperature, p.top_p, p.top_k) for p in params]
    host[:, 4] = drawn
    settings = torch.from_numpy(host)
    if logits.is_cuda:
        settings = settings.pin_memory().to(logits.device, non_blocking=True)
    rows = settings[:, 4].to(torch.int64)
    if n < len(seqs):
        logits = logits.index_select(0, rows)
    return out.index_copy(0, rows, draw(_probs(logits, settings, params), settings[:, 0]))
