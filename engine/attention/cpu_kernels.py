"""The CPU decode-attention kernel (``cpu_paged_decode.c``), built once with the system C
compiler (``engine/native``) and called through ctypes.

Why C: written with torch ops, paged decode attention either gathers every context into a
copy or leaves ``torch.compile`` to fuse a per-token index into the dot products; measured
here, both run 6-8 times slower than reading the KV once, and decode attention was 30% of
a batch job's time. The kernel reads each block in place through the block table.

Threads: the kernel's OpenMP loop runs on torch's own OpenMP threads (ctypes releases the
GIL for the call). It replaced Python threads that each ran part of the items: those
competed with torch's spinning OpenMP workers for the same cores.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from engine import native

SOURCE = Path(__file__).with_name("cpu_paged_decode.c")
BODY = SOURCE.with_name("cpu_paged_decode_body.h")  # included by SOURCE once per instance
# Both are part of the build cache key, with the bfloat16 conversions SOURCE includes.
INCLUDES = (BODY, native.BF16_HEADER, native.AVX512_MATH_HEADER, native.FAST_EXP_HEADER)
# Contraction into FMAs is left on here (the kernel's sums need not match torch's rounding).
FLAGS = [f for f in native.FLAGS if f != "-ffp-contract=off"]


@functools.cache
def load() -> ctypes.CDLL | None:
    """The built kernel library, or None (with one warning) where it cannot be had."""
    lib = native.load("paged_decode", SOURCE, INCLUDES, FLAGS)
    if lib is None:
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    for fn in (lib.paged_decode_f32, lib.paged_decode_bf16, lib.paged_decode_bf16q):
        fn.argtypes = [p, i64, p, p, p, i64, p, p, i64, i64, i64, i64, i64, ctypes.c_float, i64, i64, i64]
        fn.restype = ctypes.c_int
    return lib


def _instance(kernel, q: torch.Tensor, k_cache: torch.Tensor):
    """The C instance for these queries and this cache, its I/O dtype, and the queries ready for
    it. bfloat16 queries with a bfloat16 cache take the instance that reads and writes bfloat16
    (and may score with bf16 dot products); otherwise queries and outputs are float32. Queries
    are read in place when each head's row is contiguous (a view of the fused projection)."""
    if q.dtype == k_cache.dtype == torch.bfloat16:
        fn, io_dtype = kernel.bf16_queries, torch.bfloat16
    else:
        fn, io_dtype = kernel.fns[k_cache.dtype], torch.float32
    qk = q.to(io_dtype)
    if qk.stride(2) != 1 or qk.stride(1) != q.shape[2]:
        qk = qk.contiguous()
    return fn, io_dtype, qk


PREFILL_SOURCE = SOURCE.with_name("cpu_paged_prefill.c")
NO_WINDOW = 1 << 40  # the prefill kernel's window for a layer without one: longer than any context


@functools.cache
def load_prefill() -> ctypes.CDLL | None:
    """The built prefill library (AVX-512, or AVX2 with FMA: None elsewhere, and where it cannot be built)."""
    lib = native.load("paged_prefill", PREFILL_SOURCE,
                      (native.BF16_HEADER, native.AVX512_MATH_HEADER, native.AVX2_MATH_HEADER,
                       native.FAST_EXP_HEADER), FLAGS)
    if lib is None or not hasattr(lib, "paged_prefill_f32"):
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    for fn in (lib.paged_prefill_f32, lib.paged_prefill_bf16, lib.paged_prefill_bf16q):
        fn.argtypes = [p, i64, p, p, p, i64, p, p, i64, i64, p, i64, i64, i64, i64, ctypes.c_float, i64, i64]
        fn.restype = ctypes.c_int
    lib.paged_prefill_tile.restype = ctypes.c_int
    return lib


# AVX2 builds (tiles of 8 tokens) were faster than SDPA per chunk up to about this many positions
# per sequence and slower past it (bench/probe_prefill_attention.py on an AVX2-only AMD EPYC, 2
# cores: 1.5x at 230, 1.1x at 1,000, 0.85x at 2,000, 0.6-0.8x for 2,000 after 6,000 cached).
AVX2_MAX_SEQ_LEN = 1024


class PagedPrefillKernel:
    """``kernel(q, k_cache, v_cache, meta, scale, out)``: the prompt chunks of a step (sequences
    ``meta.num_decodes`` onward), written into their rows of ``out``. head_dim 64 only. With a
    sliding ``window``, each token sees only the last ``window`` positions up to its own."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.fns = {torch.float32: lib.paged_prefill_f32, torch.bfloat16: lib.paged_prefill_bf16}
        self.bf16_queries = lib.paged_prefill_bf16q
        self.tile = lib.paged_prefill_tile()
        self.max_seq_len = AVX2_MAX_SEQ_LEN if self.tile < 16 else None  # None: no limit

    def faster_for(self, meta) -> bool:
        """Whether this build beats SDPA on the step's prompt chunks (see AVX2_MAX_SEQ_LEN)."""
        return self.max_seq_len is None or max(meta.seq_lens_host[meta.num_decodes :]) <= self.max_seq_len

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta, scale: float,
                 out: torch.Tensor, window: int | None = None) -> None:
        num_heads, head_dim = q.shape[1], q.shape[2]
        num_kv_heads, num_blocks, block_size, _ = k_cache.shape
        assert head_dim == 64 and k_cache.dtype == v_cache.dtype and k_cache.is_contiguous() and v_cache.is_contiguous()
        fn, io_dtype, qk = _instance(self, q, k_cache)
        target = out if out.dtype == io_dtype and out.is_contiguous() else torch.empty(q.shape, dtype=io_dtype)
        tables = meta.block_tables
        if tables.dtype != torch.int32 or tables.stride(-1) != 1:
            tables = tables.to(torch.int32).contiguous()
        starts = meta.query_start_loc.to(torch.int32).contiguous()
        contexts = meta.context_lens.to(torch.int32).contiguous()
        code = fn(qk.data_ptr(), qk.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
                  tables.stride(0), starts.data_ptr(), contexts.data_ptr(), meta.num_decodes, meta.num_seqs,
                  target.data_ptr(), num_heads, num_kv_heads, num_blocks, block_size, scale,
                  max(1, torch.get_num_threads()), window or NO_WINDOW)
        if code == -1:
            raise MemoryError("CPU prefill kernel could not allocate its scratch")
        if code == -2:
            raise ValueError(f"CPU prefill kernel: unsupported shape ({num_heads} heads, {num_kv_heads} KV heads, "
                             f"block size {block_size})")
        if code:
            raise PagedDecodeKernel._bad_table(code - 1, tables, meta.seq_lens_host, block_size, num_blocks)
        if target is not out:
            first = int(starts[meta.num_decodes])
            out[first:] = target[first:].to(out.dtype)


class PagedDecodeKernel:
    """``kernel(q, k_cache, v_cache, tables, seq_lens, seq_lens_host, scale, out=None, window=None) -> out``.
    With a sliding ``window``, each sequence attends to its last ``window`` positions only, and
    the blocks before them are not read."""

    KV_DTYPES = (torch.float32, torch.bfloat16)

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.fns = {torch.float32: lib.paged_decode_f32, torch.bfloat16: lib.paged_decode_bf16}
        self.bf16_queries = lib.paged_decode_bf16q

    @staticmethod
    def _bad_table(seq: int, tables: torch.Tensor, lens: list[int], block_size: int, num_blocks: int) -> IndexError:
        """The error for a sequence whose block table points outside the pool (the kernel refused it)."""
        used = tables[seq, : -(-lens[seq] // block_size)].tolist()
        bad = [b for b in used if not 0 <= b < num_blocks]
        return IndexError(f"decode attention: block table of sequence {seq} holds block id {bad[0]} "
                          f"outside the KV pool of {num_blocks} blocks")

    def __call__(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
        seq_lens: torch.Tensor, seq_lens_host: list[int] | None, scale: float, out: torch.Tensor | None = None,
        window: int | None = None,
    ) -> torch.Tensor:
        """``q``: ``[n, num_heads, head_dim]``, any row stride (a view of the fused projection is
        read in place); ``out``: where to write (``q``'s dtype, contiguous), else a new tensor.
        ``seq_lens_host``: the lengths as a list where the caller has one (only read to name a
        bad block table)."""
        n, num_heads, head_dim = q.shape
        num_kv_heads, num_blocks, block_size, _ = k_cache.shape
        assert k_cache.dtype == v_cache.dtype and k_cache.dtype in self.KV_DTYPES
        assert k_cache.is_contiguous() and v_cache.is_contiguous()
        fn, io_dtype, qk = _instance(self, q, k_cache)
        if tables.dtype != torch.int32 or tables.stride(-1) != 1:  # the engine's metadata is int32 already
            tables = tables.to(torch.int32).contiguous()
        if seq_lens.dtype != torch.int32 or not seq_lens.is_contiguous():
            seq_lens = seq_lens.to(torch.int32).contiguous()
        target = out if out is not None and out.dtype == io_dtype and out.is_contiguous() else None
        result = torch.empty(q.shape, dtype=io_dtype) if target is None else target
        code = fn(qk.data_ptr(), qk.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
                  tables.stride(0), seq_lens.data_ptr(), result.data_ptr(), num_heads, num_kv_heads, num_blocks,
                  block_size, head_dim, scale, n, max(1, torch.get_num_threads()), window or 0)
        if code < 0:
            raise MemoryError("CPU decode kernel could not allocate its scratch")
        if code:
            lens = seq_lens.tolist() if seq_lens_host is None else seq_lens_host
            raise self._bad_table(code - 1, tables, lens, block_size, num_blocks)
        if out is not None and target is None:
            out.copy_(result)
            return out
        return result if result.dtype == q.dtype else result.to(q.dtype)


def write_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> bool:
    """Copy ``key``/``value`` ``[T, kv_heads, head_dim]`` (views of one fused projection: same
    strides) to their slots of a ``[kv_heads, blocks, block_size, head_dim]`` pool, in C
    (``engine/native/fused_ops.c``). Returns False, having written nothing, where that does not
    apply (the caller then uses torch ops)."""
    fn = native.fused_fn("write_kv", key, value, k_cache, v_cache)
    if (fn is None or key.stride() != value.stride() or key.stride(-1) != 1 or key.stride(-2) != key.shape[-1]
            or not (k_cache.is_contiguous() and v_cache.is_contiguous()) or slot_mapping.dtype != torch.int64
            or not slot_mapping.is_contiguous() or slot_mapping.device.type != "cpu"):
        return False
    rows, heads, head_dim = key.shape
    pool_slots = k_cache.shape[1] * k_cache.shape[2]
    bad = fn(key.data_ptr(), value.data_ptr(), key.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
             slot_mapping.data_ptr(), rows, heads, head_dim, pool_slots, native.threads())
    if bad:
        raise IndexError(f"KV write: slot {int(slot_mapping[bad - 1])} of row {bad - 1} is outside the pool "
                         f"of {pool_slots} slots")
    return True
