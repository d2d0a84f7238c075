"""The C decode-attention kernel of the CPU path against the torch reference."""

from __future__ import annotations

import pytest
import torch

from engine.attention.cpu_kernels import PagedDecodeKernel, load
from engine.attention.torch_backend import TorchAttentionBackend, paged_decode_attention

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
