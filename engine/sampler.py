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

from operator import attrgetter

import numpy as np
import torch

from engine.sampling_params import SamplingParams, greedy_temperature
from engine.sequence import Sequence

_TEMPERATURE = attrgetter("params.temperature")
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
    cut = cut_offs(logits, top_k, top_p, k_max)
    return logits.masked_fill(logits < cut[:, None], float("-inf"))


def cut_offs(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, k_max: int | None = None) -> torch.Tensor:
    """Each row's smallest logit that ``filter_top_k_top_p`` keeps."""
    sorted_logits = _sorted_descending(logits, k_max)
    width = sorted_logits.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=width), torch.full_like(top_k, width))
    ranks = torch.arange(width, device=logits.device)
    outside_k = ranks[None, :] >= k[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(outside_k, float("-inf")), dim=-1)
    # a row with top_p 1 keeps all (its float sums can pass 1.0 before the end)
    outside = ((probs.cumsum(-1) - probs > top_p[:, None]) & (top_p < 1.0)[:, None]) | outside_k
    # the smallest logit both filters keep is the row's cut-off (rank 0 is always kept)
    return torch.where(outside, torch.full_like(sorted_logits, float("inf")), sorted_logits).amin(-1)


def host_cut_offs(scaled: np.ndarray, top_k: np.ndarray, top_p: np.ndarray, k_max: int | None) -> np.ndarray:
    """``cut_offs`` in numpy, for CPU rows: on ``[rows, k]`` arrays a numpy op costs a few
    microseconds where a torch op costs tens, and a 256-row step runs about ten of them."""
    values = _sorted_descending(torch.from_numpy(scaled), k_max).numpy()
    width = values.shape[1]
    kept = np.where(top_k > 0, np.minimum(top_k, width), width)
    outside_k = np.arange(width)[None, :] >= kept[:, None]
    with np.errstate(invalid="ignore", over="ignore"):  # a NaN row yields a NaN cut-off: it keeps nothing
        weights = np.exp(np.where(outside_k, -np.inf, values) - values[:, :1])
        probs = weights / weights.sum(axis=1, keepdims=True)
        outside = ((np.cumsum(probs, axis=1) - probs > top_p[:, None]) & (top_p < 1.0)[:, None]) | outside_k
    return np.where(outside, np.inf, values).min(axis=1)


def _k_max(params: list[SamplingParams]) -> tuple[bool, int | None]:
    """Whether any row filters, and the largest top-k when every row has one (decided on the host
    from the parameters: no device sync)."""
    filters = any(p.top_k > 0 or p.top_p < 1.0 for p in params)
    return filters, (max(p.top_k for p in params) if all(p.top_k > 0 for p in params) else None)


def _probs(logits: torch.Tensor, settings: torch.Tensor, filters: bool, k_max: int | None) -> torch.Tensor:
    """Each row's sampling distribution after its temperature, top-k and top-p; ``settings`` holds
    the rows' values (columns 1-3 of ``sample``'s array), ``filters``/``k_max`` are ``_k_max``'s."""
    scaled = logits / settings[:, 1:2]
    if filters:
        scaled = filter_top_k_top_p(scaled, settings[:, 3].to(torch.int64), settings[:, 2], k_max)
    return torch.softmax(scaled, dim=-1)


def draw_kept(scaled: np.ndarray, cut: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """``draw`` for CPU rows, over only the tokens each row keeps (``scaled >= cut``), in float64:
    the same token for the same uniform, up to the last bits of the sums. Why: a vocabulary-wide
    mask, softmax and cumulative sum were most of a seeded CPU step (344 ms of sampling at 256 rows
    of a 49,152-token vocabulary with top-k 50). A row without a finite distribution (NaN) takes
    its argmax, as in ``draw``."""
    n, vocab = scaled.shape
    row_max = scaled.max(axis=1)
    flat = np.flatnonzero(scaled >= cut[:, None])  # 13x faster than the 2-D nonzero
    rows = flat // vocab
    cols = flat - rows * vocab
    cdf = np.cumsum(np.exp(scaled.ravel()[flat] - row_max[rows]), dtype=np.float64)
    counts = np.bincount(rows, minlength=n)
    ends = np.cumsum(counts)
    running = np.concatenate(([0.0], cdf))  # running[i]: the sum before kept token i
    before = running[ends - counts]
    total = running[ends] - before
    usable = (counts > 0) & np.isfinite(total) & (total > 0)
    ends = np.maximum(ends, 1)
    at = np.searchsorted(cdf, before + uniform.astype(np.float64) * total, side="right") if len(cdf) else ends - 1
    tokens = np.where(usable, cols[np.minimum(at, ends - 1)] if len(cols) else 0, 0)
    if not usable.all():
        bad = ~usable
        tokens[bad] = torch.from_numpy(scaled[bad]).argmax(dim=-1).numpy()
    return tokens.astype(np.int64)


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
    """Next token ids (int64, on the logits' device) for ``logits`` [N, vocab], one row per
    sequence that samples this step; greedy rows take the argmax. Logits in a 16-bit dtype are
    widened to float32 only in the rows that draw: an argmax of exactly widened values is the same."""
    temperatures = np.fromiter(map(_TEMPERATURE, seqs), np.float64, len(seqs))  # in C: no frame per row
    drawn = np.flatnonzero(~greedy_temperature(temperatures)).tolist()
    if not drawn:
        return logits.argmax(dim=-1)
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
    picked = (logits.index_select(0, rows) if n < len(seqs) else logits).float()
    filters, k_max = _k_max(params)
    if logits.is_cuda or not filters:
        tokens = draw(_probs(picked, settings, filters, k_max), settings[:, 0])
    else:  # numpy divides 3x faster than torch here; the same IEEE quotients
        # C order: the few-row CPU Linear hands over logits column-major, and numpy keeps the
        # layout, which made the partition and the row scans 8x slower
        scaled = np.divide(picked.detach().numpy(), host[:, 1:2], order="C")
        cut = host_cut_offs(scaled, host[:, 3].astype(np.int64), host[:, 2], k_max)
        tokens = torch.from_numpy(draw_kept(scaled, cut, host[:, 0]))
    if n == len(seqs):
        return tokens
    return logits.argmax(dim=-1).index_copy(0, rows, tokens)
