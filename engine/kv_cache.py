"""The block pool tensors and how many blocks fit in memory.

``kv_cache_dtype="fp8"`` stores keys and values as ``float8_e4m3fn``: one byte a value, so the
same memory holds twice the blocks of a bfloat16 pool (``bytes_per_block``). Each attention
layer has one scale for its keys and one for its values (``Attention.kv_scale``): a write stores
``round(x / scale)`` saturated to +-448, a read multiplies by ``scale``. The scales are 1.0, as
vLLM's default when a checkpoint brings no calibrated ``k_scale``/``v_scale``: E4M3 spans
2^-9 .. 448 with 3 mantissa bits, which covers keys and values of ordinary magnitude at a
relative error of at most 2^-4. Per-tensor rather than per-head: a scale per layer is one
scalar kernel argument, captured as such in CUDA graphs, and it is the form checkpoints carry.
"""

from __future__ import annotations

import ctypes
import logging
import os

import torch

from engine.quant.fp8_format import FP8, FP8_MAX

log = logging.getLogger(__name__)


KV_FP8 = FP8
KV_FP8_MAX = FP8_MAX
NO_SCALE = (1.0, 1.0)  # (key scale, value scale) of a layer whose cache is not FP8, or uncalibrated


def kv_pool_dtype(option: str, backend_dtype: torch.dtype) -> torch.dtype:
    """The pool's dtype for ``EngineConfig.kv_cache_dtype``: the backend's choice, or E4M3."""
    return KV_FP8 if option == "fp8" else backend_dtype


def quantize_kv(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Keys or values as the FP8 pool stores them: ``x * (1 / scale)`` saturated, rounded to
    nearest even (as the Triton write computes it, so both pools hold the same bits)."""
    return (x.float() * (1.0 / scale)).clamp_(-KV_FP8_MAX, KV_FP8_MAX).to(KV_FP8)


def dequantize_kv(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """What an FP8 pool's values stand for, in ``dtype`` (other pools: ``x`` as it is, cast)."""
    if x.dtype != KV_FP8:
        return x.to(dtype)
    return (x.float() * scale).to(dtype)


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Keys and values of every layer for one block of tokens."""
    return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def blocks_from_budget(budget_bytes: float, per_block: int) -> int:
    return max(1, int(budget_bytes // per_block))


def blocks_from_cuda_memory(device: torch.device, utilization: float, peak_bytes: int, per_block: int) -> int:
    """vLLM-style sizing: what is left of ``utilization`` of the device after the weights
    and the activation peak of a profiling step at the full token budget."""
    free, total = torch.cuda.mem_get_info(device)
    used_by_others = total - free - torch.cuda.memory_allocated(device)
    available = total * utilization - used_by_others - peak_bytes
    log.info("KV sizing on %s: %.2f GiB total, %.2f GiB used by others, %.2f GiB peak (weights + activations), "
             "%.2f GiB for the pool at utilization %.2f", device, total / 2**30, used_by_others / 2**30,
             peak_bytes / 2**30, max(available, 0) / 2**30, utilization)
    if available < per_block:
        raise RuntimeError(
            f"no room for the KV cache on {device}: {total / 2**30:.1f} GiB total, "
            f"{peak_bytes / 2**30:.2f} GiB needed by weights and activations at utilization {utilization}"
        )
    return int(available // per_block)


def allocate_kv_pool(
    num_layers: int, layer_shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device,
) -> torch.Tensor:
    """``[2, layers, *layer_shape]`` (the backend's per-layer layout), zeroed: padded reads of
    never-written slots meet a zero probability, and 0 * NaN garbage would poison the sum.

    On a CPU the pool is asked for transparent huge pages before its first touch (where the
    kernel's THP mode is ``madvise``, as here, nothing is huge unless asked). Decode attention
    reads 4-12 KB blocks scattered over gigabytes; with 4 KB pages nearly every block is a TLB
    miss. AMD EPYC (Zen 5), summ-256 in one process (``bench/ab_engine.py huge-pages``): float32
    +6%, bfloat16 +4%; summ-64 float32 unchanged. ``TOKENMILL_KV_HUGE_PAGES=0`` turns it off."""
    if torch.device(device).type != "cpu":
        return torch.zeros(2, num_layers, *layer_shape, dtype=dtype, device=device)
    pool = torch.empty(2, num_layers, *layer_shape, dtype=dtype)
    if os.environ.get("TOKENMILL_KV_HUGE_PAGES", "1") != "0":
        advise_huge_pages(pool)
    return pool.zero_()


_MADV_HUGEPAGE = 14
_HUGE_PAGE = 2 << 20


def advise_huge_pages(t: torch.Tensor) -> bool:
    """madvise(MADV_HUGEPAGE) over the 2 MiB-aligned part of ``t``'s memory; False where that
    is refused or unavailable (then the pool simply keeps 4 KB pages)."""
    start = (t.data_ptr() + _HUGE_PAGE - 1) & ~(_HUGE_PAGE - 1)
    end = (t.data_ptr() + t.numel() * t.element_size()) & ~(_HUGE_PAGE - 1)
    if end <= start:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc.madvise(start, end - start, _MADV_HUGEPAGE) == 0
    except (OSError, AttributeError):
        return False
