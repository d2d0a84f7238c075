"""Every attention path honours a sliding window (a query at position p sees keys
p - window + 1 .. p, HF's definition): the C decode kernel at head sizes 64/128/256, the torch
decode, SDPA prefill chunks, and the Triton decode and extend kernels (under the interpreter
on CPU), each against a float64 reference, with windows that start inside blocks."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton's first import (see test_triton_kernels.py)

import pytest
import torch

from engine.attention.cpu_kernels import PagedDecodeKernel, load
from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import TorchAttentionBackend

BLOCK = 16
# (context, new tokens): two decodes, a prompt chunk from scratch, a chunk after a cached prefix
SEQS = [(70, 1), (9, 1), (0, 45), (37, 20)]
WINDOWS = [1, 20, 32]


def make_step(kv_heads: int, group: int, head_dim: int, dtype, seed: int, canonical: bool):
    """Metadata, pools (``[kv_heads, blocks, 16, d]``, or ``[blocks, 16, kv_heads, d]`` when
    ``canonical``) full of random keys, and the step's q/k/v."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in SEQS]
    width = -(-max(seq_lens) // BLOCK)
    num_blocks = len(SEQS) * width + 2
    tables = torch.randperm(num_blocks, generator=gen)[: len(SEQS) * width].view(len(SEQS), width).to(torch.int32)
    starts = [0]
    for _, n in SEQS:
        starts.append(starts[-1] + n)
    slots = [int(tables[i, p // BLOCK]) * BLOCK + p % BLOCK for i, (c, n) in enumerate(SEQS) for p in range(c, c + n)]
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32), seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        context_lens=torch.tensor([c for c, _ in SEQS], dtype=torch.int32), slot_mapping=torch.tensor(slots),
        block_tables=tables, block_size=BLOCK, num_decodes=2, max_query_len=max(n for _, n in SEQS),
        max_seq_len=max(seq_lens), query_lens_host=[n for _, n in SEQS], seq_lens_host=seq_lens,
        context_lens_host=[c for c, _ in SEQS])
    shape = (num_blocks, BLOCK, kv_heads, head_dim) if canonical else (kv_heads, num_blocks, BLOCK, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    q = torch.randn(starts[-1], kv_heads * group, head_dim, generator=gen).to(dtype)
    k = torch.randn(starts[-1], kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(starts[-1], kv_heads, head_dim, generator=gen).to(dtype)
    return meta, k_cache, v_cache, q, k, v


def windowed_reference(q, k_cache, v_cache, meta, scale, window, canonical=False) -> torch.Tensor:
    """float64: each token over its sequence's keys in (position - window, position]."""
    kc = k_cache.permute(2, 0, 1, 3) if canonical else k_cache
    vc = v_cache.permute(2, 0, 1, 3) if canonical else v_cache
    kv_heads, _, _, head_dim = kc.shape
    group = q.shape[1] // kv_heads
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i, (ctx, seq_len) in enumerate(zip(meta.context_lens_host, meta.seq_lens_host, strict=True)):
        blocks = meta.block_tables[i, : -(-seq_len // BLOCK)].long()
        keys = kc[:, blocks].reshape(kv_heads, -1, head_dim)[:, :seq_len].double()
        values = vc[:, blocks].reshape(kv_heads, -1, head_dim)[:, :seq_len].double()
        for j, t in enumerate(range(int(meta.query_start_loc[i]), int(meta.query_start_loc[i + 1]))):
            pos = ctx + j
            lo = max(0, pos - window + 1)
            for h in range(q.shape[1]):
                probs = torch.softmax(keys[h // group, lo : pos + 1] @ q[t, h].double() * scale, dim=0)
                out[t, h] = probs @ values[h // group, lo : pos + 1]
    return out


@pytest.mark.parametrize("head_dim,kv_heads,group", [(64, 2, 3), (128, 1, 4), (256, 1, 4)])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("window", WINDOWS)
def test_c_decode_kernel_honours_the_window(head_dim, kv_heads, group, kv_dtype, window) -> None:
    lib = load()
    assert lib is not None, "the C decode kernel did not build"
    meta, k_cache, v_cache, q, _, _ = make_step(kv_heads, group, head_dim, kv_dtype, head_dim + window, False)
    q = q.float()
    got = PagedDecodeKernel(lib)(q[:2], k_cache, v_cache, meta.block_tables[:2], meta.seq_lens[:2],
                                 meta.seq_lens_host[:2], head_dim**-0.5, window=window)
    want = windowed_reference(q, k_cache, v_cache, meta, head_dim**-0.5, window)[:2]
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_c_decode_kernel_does_not_read_blocks_before_the_window() -> None:
    """A block wholly before the window may be gone (released, or reused by another sequence):
    a table entry there that points outside the pool is not even looked at."""
    lib = load()
    meta, k_cache, v_cache, q, _, _ = make_step(2, 3, 64, torch.float32, 0, False)
    tables = meta.block_tables[:1].clone()
    tables[0, 0] = tables[0, 1] = 10_000  # positions 0..31 of a 71-token sequence; a window of 32 starts at 39
    got = PagedDecodeKernel(lib)(q[:1], k_cache, v_cache, tables, meta.seq_lens[:1], None, 0.125, window=32)
    want = windowed_reference(q, k_cache, v_cache, meta, 0.125, 32)[:1]
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("decode_kernel", ["c", "torch"])
@pytest.mark.parametrize("window", WINDOWS)
def test_torch_backend_step_honours_the_window(decode_kernel, window) -> None:
    """A mixed step: decodes through the C kernel or torch ops, prompt chunks through SDPA."""
    backend = TorchAttentionBackend(decode_kernel=decode_kernel, compile_decode=False)
    meta, k_cache, v_cache, q, k, v = make_step(2, 2, 64, torch.float32, window, False)
    backend.write_kv(k, v, k_cache, v_cache, meta)
    got = backend.attend(q, k, v, k_cache, v_cache, meta, 0.125, window)
    want = windowed_reference(q, k_cache, v_cache, meta, 0.125, window)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("split", [False, True], ids=["one-split", "split-k"])
@pytest.mark.parametrize("window", WINDOWS)
def test_triton_kernels_honour_the_window(window, split) -> None:
    """split-k: the decodes' tiles start at the window's first position, interleaved over 3 splits."""
    pytest.importorskip("triton", reason="triton is not installed")
    from engine.attention.triton_backend import DecodeLaunch, TritonAttentionBackend, interpreted
    from engine.attention.triton_kernels import extend_kernel

    if not interpreted(extend_kernel):
        pytest.skip("triton was imported before TRITON_INTERPRET=1 (run with tests/conftest.py)")
    launch = DecodeLaunch(block_n=16, min_partition=16, target_programs=1 << 16, max_splits=3)
    backend = TritonAttentionBackend(launch if split else None)
    meta, k_cache, v_cache, q, k, v = make_step(1, 2, 16, torch.float32, window, True)
    backend.write_kv(k, v, k_cache, v_cache, meta)
    got = backend.attend(q, k, v, k_cache, v_cache, meta, 0.25, window)
    want = windowed_reference(q, k_cache, v_cache, meta, 0.25, window, canonical=True)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("kv_dtype,q_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                              (torch.bfloat16, torch.bfloat16)], ids=str)
@pytest.mark.parametrize("window", WINDOWS)
def test_c_prefill_kernel_honours_the_window(kv_dtype, q_dtype, window) -> None:
    """Head size 64 (the kernel's): chunks of 45 and 20 tokens, one after 37 cached ones, so
    16-token tiles, 16-position blocks and window edges all fall at different places; the
    first block a chunk's window leaves behind is made unreadable."""
    from engine.attention.cpu_kernels import PagedPrefillKernel, load_prefill
    lib = load_prefill()
    if lib is None:
        pytest.skip("the prefill kernel needs AVX-512 or AVX2 with FMA, and a C compiler")
    meta, k_cache, v_cache, q, _, _ = make_step(3, 3, 64, kv_dtype, window, False)
    q = q.to(q_dtype)
    want = windowed_reference(q, k_cache, v_cache, meta, 0.125, window)
    if window <= 20:
        meta.block_tables[3, 0] = 10_000  # positions 0..15 of the chunk after 37 cached tokens: out of reach
    out = torch.full(q.shape, float("nan"), dtype=q_dtype)
    PagedPrefillKernel(lib)(q, k_cache, v_cache, meta, 0.125, out, window)
    rows = slice(int(meta.query_start_loc[2]), None)
    tol = 1e-5 if q_dtype == torch.float32 else 8e-3
    torch.testing.assert_close(out[rows].double(), want[rows], atol=tol, rtol=tol)
