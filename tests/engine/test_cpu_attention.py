"""The C decode-attention kernel of the CPU path against the torch reference, alone and as the
backend runs it for whole mixed steps (decodes and prompt chunks)."""

from __future__ import annotations

import pytest
import torch

from engine.attention.cpu_kernels import PagedDecodeKernel, load, load_prefill
from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import TorchAttentionBackend, paged_decode_attention
from engine.cpu_info import has_amx

BLOCK_SIZE = 16
LENGTHS = [1, 15, 16, 17, 100, 0]


@pytest.fixture(scope="module")
def kernel() -> PagedDecodeKernel:
    lib = load()
    assert lib is not None, "the C decode kernel did not build (a C compiler is part of the dev setup)"
    return PagedDecodeKernel(lib)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("num_kv_heads,group,head_dim", [(2, 1, 64), (1, 3, 128), (3, 3, 64), (2, 2, 96), (1, 4, 64)])
@pytest.mark.parametrize("kv_dtype,q_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                              (torch.bfloat16, torch.bfloat16)])
def test_kernel_matches_torch_reference(kernel, num_kv_heads, group, head_dim, threads, kv_dtype, q_dtype) -> None:
    """Every instance: float32 cache, bfloat16 cache (widened), and bfloat16 cache with bfloat16
    queries (scored by bf16 dot products where the CPU has them); lengths across block edges."""
    gen = torch.Generator().manual_seed(head_dim + group)
    n = len(LENGTHS)
    width = -(-max(LENGTHS) // BLOCK_SIZE)
    num_blocks = n * width + 5
    shape = (num_kv_heads, num_blocks, BLOCK_SIZE, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=gen).to(kv_dtype), torch.randn(shape, generator=gen).to(kv_dtype)
    tables = torch.randperm(num_blocks, generator=gen)[: n * width].view(n, width).to(torch.int32)
    seq_lens = torch.tensor(LENGTHS, dtype=torch.int32)
    # the engine's queries: a view of the fused qkv rows (the row stride spans q, k and v)
    qkv = torch.randn(n, (num_kv_heads * group + 2 * num_kv_heads) * head_dim, generator=gen).to(q_dtype)
    q = qkv[:, : num_kv_heads * group * head_dim].view(n, num_kv_heads * group, head_dim)

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = kernel(q, k_cache, v_cache, tables, seq_lens, LENGTHS, head_dim**-0.5)
    finally:
        torch.set_num_threads(before)
    qb = q.double().view(n, num_kv_heads, group, head_dim).transpose(0, 1)
    ref = paged_decode_attention(qb, k_cache.double(), v_cache.double(), tables.long(), seq_lens, head_dim**-0.5)
    ref = ref.transpose(0, 1).reshape(n, -1, head_dim)
    live = [i for i, length in enumerate(LENGTHS) if length > 0]
    assert got.dtype == q_dtype
    # float32 math throughout; a bfloat16 result is the float32 one rounded once
    tol = 1e-5 if q_dtype == torch.float32 else 8e-3
    torch.testing.assert_close(got[live].double(), ref[live], atol=tol, rtol=tol)
    assert torch.equal(got[LENGTHS.index(0)], torch.zeros_like(got[0]))  # nothing to attend to: zeros


def test_kernel_returns_the_query_dtype(kernel) -> None:
    k_cache = torch.randn(1, 4, BLOCK_SIZE, 64)
    q = torch.randn(1, 2, 64).to(torch.bfloat16)
    out = kernel(q, k_cache, k_cache.clone(), torch.tensor([[2, 0]], dtype=torch.int32),
                 torch.tensor([20], dtype=torch.int32), [20], 0.125)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape


def test_backend_uses_the_kernel_and_can_be_told_not_to() -> None:
    assert TorchAttentionBackend().kernel is not None
    assert TorchAttentionBackend(decode_kernel="torch").kernel is None
    with pytest.raises(ValueError, match="decode_kernel must be auto, c or torch, got 'gpu'"):
        TorchAttentionBackend(decode_kernel="gpu")


def _step(kv_heads: int, group: int, contexts: list[int], query_lens: list[int], num_decodes: int, kv_dtype,
          q_dtype, gen: torch.Generator):
    """A step's queries, new keys and values, a shuffled pool and its metadata: the first
    ``num_decodes`` sequences decode, the rest are prompt chunks after ``contexts`` cached tokens."""
    head_dim, heads = 64, kv_heads * group
    seq_lens = [c + q for c, q in zip(contexts, query_lens, strict=True)]
    width = -(-max(seq_lens) // BLOCK_SIZE)
    num_blocks = len(seq_lens) * width + 3
    shape = (kv_heads, num_blocks, BLOCK_SIZE, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=gen).to(kv_dtype), torch.randn(shape, generator=gen).to(kv_dtype)
    tables = torch.randperm(num_blocks, generator=gen)[: len(seq_lens) * width].view(-1, width).to(torch.int32)
    starts = [0]
    for q_len in query_lens:
        starts.append(starts[-1] + q_len)
    slots = [int(tables[i, p // BLOCK_SIZE]) * BLOCK_SIZE + p % BLOCK_SIZE
             for i, (c, s) in enumerate(zip(contexts, seq_lens, strict=True)) for p in range(c, s)]
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32), seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        context_lens=torch.tensor(contexts, dtype=torch.int32), slot_mapping=torch.tensor(slots),
        block_tables=tables, block_size=BLOCK_SIZE, num_decodes=num_decodes, max_query_len=max(query_lens),
        max_seq_len=max(seq_lens), query_lens_host=query_lens, seq_lens_host=seq_lens, context_lens_host=contexts)
    qkv = torch.randn(starts[-1], (heads + 2 * kv_heads) * head_dim, generator=gen).to(q_dtype)
    q = qkv[:, : heads * head_dim].view(-1, heads, head_dim)
    k = qkv[:, heads * head_dim: (heads + kv_heads) * head_dim].view(-1, kv_heads, head_dim)
    v = qkv[:, (heads + kv_heads) * head_dim:].view(-1, kv_heads, head_dim)
    return q, k, v, k_cache, v_cache, meta


def _mixed_step(dtype: torch.dtype, gen: torch.Generator):
    """Two decodes, a prompt chunk with no cached context and one after a cached prefix (a
    prefix hit or a later chunk), their keys already in a shuffled pool."""
    return _step(3, 3, [40, 17, 0, 33], [1, 1, 37, 20], 2, dtype, dtype, gen)


def _causal_reference(q, k_cache, v_cache, meta, scale) -> torch.Tensor:
    """float64 attention of each token over its sequence's keys up to its own position."""
    kv_heads, _, _, head_dim = k_cache.shape
    group = q.shape[1] // kv_heads
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i, (ctx, seq_len) in enumerate(zip(meta.context_lens_host, meta.seq_lens_host, strict=True)):
        blocks = meta.block_tables[i, : -(-seq_len // BLOCK_SIZE)].long()
        keys = k_cache[:, blocks].reshape(kv_heads, -1, head_dim)[:, :seq_len].double()
        values = v_cache[:, blocks].reshape(kv_heads, -1, head_dim)[:, :seq_len].double()
        for j, t in enumerate(range(int(meta.query_start_loc[i]), int(meta.query_start_loc[i + 1]))):
            seen = ctx + j + 1
            for h in range(q.shape[1]):
                probs = torch.softmax(keys[h // group, :seen] @ q[t, h].double() * scale, dim=0)
                out[t, h] = probs @ values[h // group, :seen]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prefill_kernel", [True, False])
def test_mixed_step_attention_matches_reference(dtype, prefill_kernel, monkeypatch) -> None:
    """Decodes and prompt chunks (with and without a cached prefix) in one step, through the
    decode and prefill kernels or through SDPA per chunk: the same causal attention."""
    q, k, v, k_cache, v_cache, meta = _mixed_step(dtype, torch.Generator().manual_seed(7))
    backend = TorchAttentionBackend(prefill_kernel=prefill_kernel)
    backend.write_kv(k, v, k_cache, v_cache, meta)
    in_kernel = backend._prefill_in_kernel(q, k_cache, meta)
    assert in_kernel == (prefill_kernel and load_prefill() is not None and not (dtype == torch.bfloat16 and has_amx()))
    if in_kernel:  # no chunk may take the SDPA path then
        monkeypatch.setattr(backend, "_prefill_one", lambda *a: pytest.fail("SDPA path taken"))
    got = backend.attend(q, k, v, k_cache, v_cache, meta, 0.125)
    want = _causal_reference(q, k_cache, v_cache, meta, 0.125)
    tol = 2e-5 if dtype == torch.float32 else 1.6e-2
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)


@pytest.fixture(scope="module")
def prefill():
    from engine.attention.cpu_kernels import PagedPrefillKernel, load_prefill

    lib = load_prefill()
    if lib is None:
        pytest.skip("the prefill kernel needs AVX-512 or AVX2 with FMA, and a C compiler")
    return PagedPrefillKernel(lib)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("kv_heads", "group"), [(2, 1), (3, 3), (1, 4), (1, 8)])
@pytest.mark.parametrize("kv_dtype,q_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                              (torch.bfloat16, torch.bfloat16)])
def test_prefill_kernel_matches_reference(prefill, kv_heads, group, kv_dtype, q_dtype, threads) -> None:
    """Every instance; chunks of 1, 16 (one tile) and 33 tokens (three tiles, the last of one
    token) after contexts of 0, 5 and 40 tokens, so tiles and blocks straddle each other."""
    q, _, _, k_cache, v_cache, meta = _step(kv_heads, group, [0, 5, 40], [33, 1, 16], 0, kv_dtype, q_dtype,
                                            torch.Generator().manual_seed(group))
    out = torch.full(q.shape, float("nan"), dtype=q_dtype)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        prefill(q, k_cache, v_cache, meta, 0.125, out)
    finally:
        torch.set_num_threads(before)
    want = _causal_reference(q, k_cache, v_cache, meta, 0.125)
    tol = 1e-5 if q_dtype == torch.float32 else 8e-3
    torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol)


def test_prefill_kernel_refuses_a_table_outside_the_pool(prefill) -> None:
    q, _, _, k_cache, v_cache, meta = _step(1, 3, [0, 20], [4, 4], 0, torch.float32, torch.float32,
                                            torch.Generator().manual_seed(0))
    meta.block_tables[1, 1] = k_cache.shape[1] + 7
    bad = k_cache.shape[1] + 7
    with pytest.raises(IndexError, match=f"block table of sequence 1 holds block id {bad} outside the KV pool"):
        prefill(q, k_cache, v_cache, meta, 0.125, torch.empty_like(q))


def test_the_avx2_prefill_build_leaves_long_sequences_to_sdpa(prefill) -> None:
    """The AVX2 build (tiles of 8) lost to SDPA on sequences past about 1,000 positions; the
    AVX-512 build (tiles of 16) won at every length measured."""
    from types import SimpleNamespace

    from engine.attention.cpu_kernels import AVX2_MAX_SEQ_LEN

    def step(*prompt_lens: int):
        return SimpleNamespace(num_decodes=1, seq_lens_host=[4000, *prompt_lens])

    assert prefill.tile in (8, 16)
    assert prefill.faster_for(step(300, AVX2_MAX_SEQ_LEN))
    assert prefill.faster_for(step(300, AVX2_MAX_SEQ_LEN + 1)) == (prefill.tile == 16)
