"""CPU attention over the paged pool with plain torch ops.

Layout ``[num_kv_heads, num_blocks, block_size, head_dim]``: gathering a sequence's blocks
for one head yields its keys as one contiguous ``context x head_dim`` matrix, so a batch of
decodes is one ``index_select`` and two batched matmuls of (query group x context), with no
transposing copy and no per-block matmuls.

Decodes go to the C kernel of ``cpu_kernels.py``, which reads each sequence's blocks in place
(with torch ops as the fallback: decodes batched by length bucket, compiled). On AVX-512
CPUs without AMX, prefill chunks of head_dim 64 go to the C prefill kernel
(``cpu_paged_prefill.c``; on AVX2-only CPUs, steps whose prompt sequences are at most 1,024
positions long): tiles of 16 (AVX2: 8) prompt tokens against the blocks in place, flash style,
so prefix hits need no gather or mask; a layer's sliding window is honoured there too. On an AMD EPYC (Zen 5) it ran 2.4-3.4x faster than SDPA
in bfloat16 and 2.2-3.0x in float32 (``bench/probe_prefill_attention.py``). Otherwise prefill
chunks go one sequence at a time through SDPA, and a chunk with no cached context uses its
fresh keys and skips the gather.

An FP8 pool (``kv_cache_dtype="fp8"``, ``engine/kv_cache.py``) is written and read with torch
ops only (the C kernels take float32 and bfloat16 pools): values are divided by the layer's scale
on the way in and multiplied by it on the way out, decodes run ``paged_decode_attention`` eagerly,
and prefill chunks read even their fresh keys back from the pool, so every token attends to the
rounded keys, as in the Triton kernels.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from engine.attention.backend import AttentionBackend
from engine.attention.cpu_kernels import PagedDecodeKernel, PagedPrefillKernel, load, load_prefill, write_kv
from engine.attention.metadata import AttentionMetadata
from engine.cpu_info import has_amx
from engine.kv_cache import KV_FP8, NO_SCALE, dequantize_kv, quantize_kv


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def __init__(
        self, decode_bucket_waste: float = 0.25, compile_decode: bool = True, decode_kernel: str = "auto",
        prefill_kernel: bool = True,
    ) -> None:
        """``decode_kernel``: ``auto`` uses the C kernel (``cpu_kernels.py``) where it builds,
        ``c`` requires it, ``torch`` uses torch ops only (the reference). ``prefill_kernel``:
        let that kernel run prefill chunks where it is the faster (False: always SDPA)."""
        if decode_kernel not in ("auto", "c", "torch"):
            raise ValueError(f"decode_kernel must be auto, c or torch, got {decode_kernel!r}")
        self.decode_bucket_waste = decode_bucket_waste
        self.compile_decode = compile_decode
        self.prefill_kernel = prefill_kernel
        self.kernel = None
        self.prefill_kernel_fn = None
        if decode_kernel != "torch":
            lib = load()
            if lib is None and decode_kernel == "c":
                raise RuntimeError("the C decode kernel is not available (no compiler, or TOKENMILL_CPU_KERNELS=0)")
            self.kernel = PagedDecodeKernel(lib) if lib is not None else None
            if self.kernel is not None and prefill_kernel:
                prefill_lib = load_prefill()
                self.prefill_kernel_fn = PagedPrefillKernel(prefill_lib) if prefill_lib is not None else None

    block_axis = 1

    def kv_cache_shape(self, num_blocks, block_size, num_kv_heads, head_dim):
        return (num_kv_heads, num_blocks, block_size, head_dim)

    def kv_cache_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """bfloat16 models keep a bfloat16 cache where the C kernel runs (it widens each key
        as it reads it: half the bytes per decode step); everything else is float32, since
        the compiled torch decode reads 16-bit keys several times slower than 32-bit ones."""
        if model_dtype == torch.bfloat16 and self.kernel is not None:
            return torch.bfloat16
        return torch.float32

    def write_kv(self, key, value, k_cache, v_cache, meta: AttentionMetadata, kv_scale=NO_SCALE) -> None:
        fp8 = k_cache.dtype == KV_FP8
        if self.kernel is not None and not fp8:
            if write_kv(key, value, k_cache, v_cache, meta.slot_mapping):
                return
        bs = meta.block_size
        blocks = torch.div(meta.slot_mapping, bs, rounding_mode="floor")
        offsets = meta.slot_mapping - blocks * bs
        key, value = key.transpose(0, 1), value.transpose(0, 1)
        if fp8:
            key, value = quantize_kv(key, kv_scale[0]), quantize_kv(value, kv_scale[1])
        k_cache[:, blocks, offsets] = key.to(k_cache.dtype)
        v_cache[:, blocks, offsets] = value.to(v_cache.dtype)

    def attend(self, query, key, value, k_cache, v_cache, meta: AttentionMetadata, scale: float,
               window: int | None = None, kv_scale=NO_SCALE):
        out = torch.empty_like(query)
        nd = meta.num_decodes
        if meta.num_seqs > nd and self._prefill_in_kernel(query, k_cache, meta):
            if nd:
                self._decode(query[:nd], k_cache, v_cache, meta, scale, out[:nd], window)
            self.prefill_kernel_fn(query, k_cache, v_cache, meta, scale, out, window)
            return out
        if nd:
            self._decode(query[:nd], k_cache, v_cache, meta, scale, out[:nd], window, kv_scale)
        starts = meta.query_start_loc.tolist() if meta.num_seqs > nd else []
        for i in range(nd, meta.num_seqs):
            s, e = starts[i], starts[i + 1]
            out[s:e] = self._prefill_one(query[s:e], key[s:e], value[s:e], k_cache, v_cache, meta, i, scale, window,
                                         kv_scale)
        return out

    def _prefill_one(self, q, k_new, v_new, k_cache, v_cache, meta, i, scale, window=None, kv_scale=NO_SCALE):
        """One prompt chunk through SDPA. With a window, only the blocks that hold a key some
        query of the chunk sees are gathered (from ``first``), and the mask is a band."""
        ctx = meta.context_lens_host[i]
        seq_len = meta.seq_lens_host[i]
        if window is not None and window < seq_len:
            bs = meta.block_size
            first = max(0, ctx - window + 1) // bs * bs  # the first position any query sees, block-aligned
            blocks = meta.block_tables[i, first // bs : -(-seq_len // bs)]
            h, d = k_cache.shape[0], k_cache.shape[3]
            k = k_cache.index_select(1, blocks).view(h, -1, d)[:, : seq_len - first]
            v = v_cache.index_select(1, blocks).view(h, -1, d)[:, : seq_len - first]
            rows = torch.arange(ctx, seq_len, device=q.device)[:, None]
            cols = torch.arange(first, seq_len, device=q.device)[None, :]
            mask, causal = (cols <= rows) & (cols > rows - window), False
        elif ctx == 0 and k_cache.dtype != KV_FP8:
            k, v, mask, causal = k_new.transpose(0, 1), v_new.transpose(0, 1), None, True
        else:
            nb = -(-seq_len // meta.block_size)
            blocks = meta.block_tables[i, :nb]
            h, d = k_cache.shape[0], k_cache.shape[3]
            k = k_cache.index_select(1, blocks).view(h, -1, d)[:, :seq_len]
            v = v_cache.index_select(1, blocks).view(h, -1, d)[:, :seq_len]
            mask = torch.ones(q.shape[0], seq_len, dtype=torch.bool, device=q.device).tril(diagonal=ctx)
            causal = False
        dtype = self._sdpa_dtype(q)
        q, k, v = q.to(dtype), dequantize_kv(k, kv_scale[0], dtype), dequantize_kv(v, kv_scale[1], dtype)
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
            attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True,
        )
        return o.squeeze(0).transpose(0, 1).to(k_new.dtype)

    def _prefill_in_kernel(self, q: torch.Tensor, k_cache: torch.Tensor, meta: AttentionMetadata) -> bool:
        """Whether prefill chunks go through the C prefill kernel (see the module docstring): only
        where it was measured faster. With AMX, bfloat16 SDPA is faster on long chunks; the AVX2
        build is faster on sequences up to about 1,000 positions."""
        return (self.prefill_kernel_fn is not None and self.prefill_kernel and q.device.type == "cpu"
                and k_cache.dtype in self.kernel.KV_DTYPES and q.shape[-1] == 64
                and not (q.dtype == torch.bfloat16 and has_amx()) and self.prefill_kernel_fn.faster_for(meta))

    @staticmethod
    def _sdpa_dtype(q: torch.Tensor) -> torch.dtype:
        """CPU SDPA in 16-bit is several times slower than in float32 without AMX, and 1.5-3x
        faster with it (prefill chunks of 230-2000 tokens, measured on a 2-core Xeon with AMX)."""
        if q.dtype == torch.bfloat16 and q.device.type == "cpu" and has_amx():
            return q.dtype
        return torch.float32

    def _decode(self, q, k_cache, v_cache, meta, scale, out, window=None, kv_scale=NO_SCALE) -> None:
        nd = meta.num_decodes
        if self.kernel is not None and q.device.type == "cpu" and k_cache.dtype in self.kernel.KV_DTYPES:
            self.kernel(q, k_cache, v_cache, meta.block_tables[:nd], meta.seq_lens[:nd],
                        meta.seq_lens_host[:nd], scale, out=out, window=window)
            return
        lens = meta.seq_lens_host[:nd]
        for idx in self._buckets(lens):
            self._decode_bucket(q, k_cache, v_cache, meta, scale, out, idx, max(lens[j] for j in idx), window,
                                kv_scale)

    def _buckets(self, lens: list[int]) -> list[list[int]]:
        """Group decodes of similar length so padding to a bucket's longest wastes little."""
        order = sorted(range(len(lens)), key=lens.__getitem__, reverse=True)
        buckets: list[list[int]] = []
        for j in order:
            if buckets:
                b = buckets[-1]
                total = sum(lens[x] for x in b) + lens[j]
                if total >= (1 - self.decode_bucket_waste) * lens[b[0]] * (len(b) + 1):
                    b.append(j)
                    continue
            buckets.append([j])
        return buckets

    def _decode_bucket(self, q, k_cache, v_cache, meta, scale, out, idx, max_len, window=None,
                       kv_scale=NO_SCALE) -> None:
        nb = -(-max_len // meta.block_size)
        n, h, d = len(idx), k_cache.shape[0], k_cache.shape[3]
        rows = torch.tensor(idx, device=q.device) if n < q.shape[0] else None
        tables = meta.block_tables[:n, :nb] if rows is None else meta.block_tables[rows, :nb]
        seq_lens = meta.seq_lens[:n] if rows is None else meta.seq_lens[rows]
        qb = (q if rows is None else q[rows]).view(n, h, -1, d).transpose(0, 1)  # [h, n, group, d]
        compiled = self.compile_decode and k_cache.dtype != KV_FP8  # FP8: the eager reference (tests)
        fn = _compiled_decode() if compiled else paged_decode_attention
        o = fn(qb, k_cache, v_cache, tables, seq_lens, scale, window or 0, *kv_scale).transpose(0, 1).reshape(n, -1, d)
        if rows is None:
            out.copy_(o)
        else:
            out[rows] = o.to(out.dtype)


def paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, scale, window: int = 0,
                           k_scale: float = 1.0, v_scale: float = 1.0):
    """One query token per sequence against its blocks, addressed through the block table.

    Written as indexing plus reductions so that ``torch.compile`` fuses the block lookup into
    the dot products and never materialises the gathered context (eager mode does gather).
    ``q``: [kv_heads, n, group, head_dim]; returns the same shape. ``window`` > 0: only the
    last ``window`` positions of each sequence are seen. An FP8 pool's keys and values are
    multiplied by ``k_scale`` and ``v_scale`` as they are read.
    """
    bs = k_cache.shape[2]
    positions = torch.arange(tables.shape[1] * bs, device=q.device)
    blocks = tables[:, positions // bs]  # [n, L]
    offsets = (positions % bs)[None, :]
    k = k_cache[:, blocks, offsets]  # [h, n, L, d]
    v = v_cache[:, blocks, offsets]
    if k.dtype == KV_FP8:
        k, v = k.float() * k_scale, v.float() * v_scale
    scores = (q.unsqueeze(-2).float() * k.unsqueeze(2).float()).sum(-1) * scale  # [h, n, group, L]
    pad = positions[None, :] >= seq_lens[:, None]
    if window > 0:
        pad = pad | (positions[None, :] < seq_lens[:, None] - window)
    scores = scores.masked_fill(pad[None, :, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return (probs.unsqueeze(-1).to(v.dtype) * v.unsqueeze(2)).sum(-2).to(q.dtype)


@functools.cache
def _compiled_decode():
    return torch.compile(paged_decode_attention, dynamic=True)
