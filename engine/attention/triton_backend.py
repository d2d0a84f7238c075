"""CUDA attention: Triton kernels that read the paged KV pool through the block tables.

``write_kv`` is one launch and ``attend`` at most three per layer and step, none of them looping over
sequences in Python: the decode kernel for the first ``num_decodes`` sequences (plus a small
reduction when the context is split across programs) and the extend kernel for the prefill
chunks. Nothing here gathers or copies the pool with torch ops.

On CPU tensors the same kernels run under the Triton interpreter when ``TRITON_INTERPRET=1``
was set before triton was first imported; that is how the tests verify them against the
torch backend (slow: for verification only). See README.md in this package.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError as exc:  # pragma: no cover - exercised only where triton is absent
    raise ImportError("the triton backend needs the triton package: pip install 'tokenmill[triton]'") from exc

import math
from dataclasses import dataclass
from typing import Any

import torch

from engine.attention import triton_kernels as K
from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.kv_cache import KV_FP8, NO_SCALE

_LOG2E = 1.4426950408889634
_SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def interpreted(kernel: Any) -> bool:
    """Whether ``kernel`` runs under the Triton interpreter.

    triton 3.9 picks interpreter or compiler when ``@triton.jit`` decorates a function, so the
    kernel and triton.language's own jitted helpers (``tl.zeros``, ``tl.sum``) must agree: both
    are interpreted only if ``TRITON_INTERPRET=1`` was set before triton was first imported.
    """
    jit = triton.runtime.JITFunction
    return not isinstance(kernel, jit) and not isinstance(tl.zeros, jit)


def _on_device(kernel: Any, device: torch.device) -> Any:
    """CPU tensors can only go through the Triton interpreter; say how to get it."""
    if device.type == "cpu" and not interpreted(kernel):
        raise RuntimeError(
            "the triton backend runs on CPU tensors only under the Triton interpreter: set "
            "TRITON_INTERPRET=1 before triton is first imported (transformers imports it via torch) "
            "or use attention_backend='torch'"
        )
    return kernel


def _dot_dtype(kernel: Any, dtype: torch.dtype) -> Any:
    """The interpreter's ``tl.dot`` mishandles bfloat16 (it multiplies the raw uint16 storage),
    so interpreted runs feed bfloat16 dots in float32, where bfloat16 products are exact."""
    return tl.float32 if interpreted(kernel) and dtype == torch.bfloat16 else _TL_DTYPES[dtype]


@dataclass(frozen=True)
class DecodeLaunch:
    """How ``decode_kernel`` is launched: its tile and launch shape, and when it splits.

    A decode's context is split across programs (split-K) only while the grid has fewer than
    ``target_programs`` programs, and never into splits of under ``min_partition`` positions,
    so long contexts in small batches still fill the GPU. Measured by bench/gpu/decode_tune.py.
    """

    # H100, the 1,024-request job's decode shapes (bench/published/gpu-decode-tune-h100-20261126.json):
    # 128-position tiles read 2.0-2.5 TB/s at 256-1,024 decodes, and splitting until 2,048 programs
    # cut the small batches' calls (8 decodes: 37 -> 16 us); the job's decode attention 1.18x faster.
    block_n: int = 128
    num_warps: int = 4
    num_stages: int = 4
    min_partition: int = 512
    target_programs: int = 2048
    max_splits: int = 16


DEFAULT_DECODE = DecodeLaunch()


@dataclass(frozen=True)
class ExtendLaunch:
    """How ``extend_kernel`` is launched for 16-bit queries at head_dim up to 64 (the measured case):
    query and key tiles, warps and pipeline stages. Other shapes keep 64-position tiles (32 in
    float32), which fit shared memory at head_dim 128-256. Measured by bench/gpu/extend_tune.py."""

    # H100, the 1,024-request job's prefill steps (bench/published/gpu-extend-tune-h100-20261126.json):
    # 32-position key tiles and 2 stages took 247 us where 64 and 3 took 285 (the three steps summed).
    block_m: int = 64
    block_n: int = 32
    num_warps: int = 4
    num_stages: int = 2


DEFAULT_EXTEND = ExtendLaunch()


class TritonAttentionBackend(AttentionBackend):
    """Paged attention with Triton kernels; decodes and prefill chunks in one launch each."""

    name = "triton"

    def __init__(self, decode: DecodeLaunch | None = None, extend: ExtendLaunch | None = None) -> None:
        self.decode = decode or DEFAULT_DECODE
        self.extend = extend or DEFAULT_EXTEND

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple:
        """Token-major blocks: a token's heads are one contiguous row, so ``write_kv`` stores
        ``num_kv_heads * head_dim`` contiguous values per token; reads gather rows of ``head_dim``."""
        return (num_blocks, block_size, num_kv_heads, head_dim)

    def write_kv(self, key, value, k_cache, v_cache, meta: AttentionMetadata, kv_scale=NO_SCALE) -> None:
        num_tokens = key.shape[0]
        if num_tokens == 0:
            return
        _check_pool(k_cache, v_cache, meta)
        num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
        key, value = _dense_last(key), _dense_last(value)
        _on_device(K.write_kv_kernel, key.device)[(num_tokens,)](
            key, value, k_cache, v_cache, meta.slot_mapping,
            key.stride(0), key.stride(1), value.stride(0), value.stride(1),
            k_cache.stride(1), k_cache.stride(2), 1.0 / kv_scale[0], 1.0 / kv_scale[1],
            NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, HEADS_PAD=triton.next_power_of_2(num_kv_heads),
            KV_FP8=k_cache.dtype == KV_FP8,
        )

    def attend(self, query, key, value, k_cache, v_cache, meta: AttentionMetadata, scale: float,
               window: int | None = None, kv_scale=NO_SCALE):
        _check_pool(k_cache, v_cache, meta)
        num_heads, head_dim = query.shape[1], query.shape[2]
        num_kv_heads = k_cache.shape[2]
        if query.dtype not in _SUPPORTED_DTYPES or k_cache.dtype not in (query.dtype, KV_FP8):
            raise TypeError(f"query {query.dtype} / cache {k_cache.dtype}: need one of {_SUPPORTED_DTYPES}, "
                            f"the cache in the query's dtype or {KV_FP8}")
        if k_cache.dtype != KV_FP8:
            kv_scale = NO_SCALE  # only an FP8 pool is scaled
        if head_dim != k_cache.shape[3] or head_dim & (head_dim - 1) or head_dim < 16:
            raise ValueError(f"head_dim {head_dim} must match the cache and be a power of two >= 16")
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} query heads do not group over {num_kv_heads} KV heads")
        query = _dense_last(query)
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        nd = meta.num_decodes
        window = _NO_WINDOW if window is None else window
        # the key scale folds into the softmax scale; the value scale multiplies each output
        qk_scale, v_scale = scale * kv_scale[0] * _LOG2E, kv_scale[1]
        if nd:
            self._decode(query, k_cache, v_cache, meta, qk_scale, v_scale, out, window)
        if meta.num_seqs > nd:
            self._extend(query, k_cache, v_cache, meta, qk_scale, v_scale, out, window)
        return out

    def _num_splits(self, num_decodes: int, num_kv_heads: int, max_len: int) -> int:
        """Split only while the grid is too small to fill the GPU, and never below min_partition."""
        d = self.decode
        by_length = -(-max_len // d.min_partition)
        by_occupancy = -(-d.target_programs // (num_decodes * num_kv_heads))
        return max(1, min(by_length, by_occupancy, d.max_splits))

    def _decode(self, query, k_cache, v_cache, meta: AttentionMetadata, qk_scale: float, v_scale: float, out,
                window: int) -> None:
        nd = meta.num_decodes
        num_heads, head_dim = query.shape[1], query.shape[2]
        num_kv_heads = k_cache.shape[2]
        group = num_heads // num_kv_heads
        launch = self.decode
        # The tuned tile is for rows of 128 bytes (bfloat16 at head_dim 64, the measured case);
        # wider rows (float32, head_dim 128-256) keep the 64-position tile that fits shared memory.
        narrow = head_dim * query.element_size() <= 128
        block_n, stages = (launch.block_n, launch.num_stages) if narrow else (min(launch.block_n, 64), min(launch.num_stages, 3))
        splits = self._num_splits(nd, num_kv_heads, max(meta.seq_lens_host[:nd]))
        if splits > 1:
            part_acc = torch.empty(nd, num_heads, splits, head_dim, dtype=torch.float32, device=query.device)
            part_ml = torch.empty(nd, num_heads, splits, 2, dtype=torch.float32, device=query.device)
        else:
            part_acc = part_ml = out  # unused by the kernel when NUM_SPLITS == 1
        kernel = _on_device(K.decode_kernel, query.device)
        kernel[(nd, num_kv_heads, splits)](
            query, k_cache, v_cache, meta.block_tables, meta.seq_lens,
            out, part_acc, part_ml,
            qk_scale, v_scale, window,
            query.stride(0), query.stride(1), out.stride(0), out.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), meta.block_tables.stride(0),
            GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
            BLOCK_SIZE=meta.block_size, BLOCK_N=block_n, NUM_SPLITS=splits,
            DOT_DTYPE=_dot_dtype(kernel, query.dtype), num_warps=launch.num_warps, num_stages=stages,
        )
        if splits > 1:
            _on_device(K.reduce_splits_kernel, query.device)[(nd, num_heads)](
                part_acc, part_ml, out, out.stride(0), out.stride(1),
                NUM_SPLITS=splits, SPLITS_PAD=triton.next_power_of_2(splits), HEAD_DIM=head_dim, num_warps=1,
            )

    def _extend(self, query, k_cache, v_cache, meta: AttentionMetadata, qk_scale: float, v_scale: float, out,
                window: int) -> None:
        nd = meta.num_decodes
        num_heads, head_dim = query.shape[1], query.shape[2]
        group = num_heads // k_cache.shape[2]
        launch = self.extend
        if query.element_size() != 2 or head_dim > 64:
            # fp32 tiles are twice the bytes: halve them to stay within shared memory at head_dim 128.
            tile = 32 if query.dtype == torch.float32 else 64
            launch = ExtendLaunch(tile, tile, 4, 3)
        block_m, block_n = launch.block_m, launch.block_n
        max_q = max(meta.query_lens_host[nd:])
        grid = (meta.num_seqs - nd, math.ceil(max_q / block_m), num_heads)
        kernel = _on_device(K.extend_kernel, query.device)
        kernel[grid](
            query, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, meta.context_lens,
            out, qk_scale, v_scale, nd, window,
            query.stride(0), query.stride(1), out.stride(0), out.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), meta.block_tables.stride(0),
            GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=meta.block_size, BLOCK_M=block_m, BLOCK_N=block_n,
            DOT_DTYPE=_dot_dtype(kernel, query.dtype), num_warps=launch.num_warps, num_stages=launch.num_stages,
        )


_NO_WINDOW = 1 << 30  # the kernels' window when a layer has none: longer than any context


def _dense_last(x: torch.Tensor) -> torch.Tensor:
    """The kernels take strides for tokens and heads but need ``head_dim`` dense. A projection
    can hand over a transposed view (the CPU few-row ``Linear``); copy only then."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _check_pool(k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata) -> None:
    """The kernels address a token as block * stride0 + offset * stride1 + head * stride2 + dim,
    with one set of strides for both pools, and walk a block-table row with unit stride."""
    if not (k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.shape == v_cache.shape):
        raise ValueError("k_cache and v_cache must be contiguous and of one shape")
    if k_cache.dim() != 4 or k_cache.shape[1] != meta.block_size:
        raise ValueError(f"pool {tuple(k_cache.shape)} is not [blocks, {meta.block_size}, kv_heads, head_dim]")
    if meta.block_tables.stride(-1) != 1 or meta.block_size & (meta.block_size - 1):
        raise ValueError("block tables need unit stride along a row and a power-of-two block size")
