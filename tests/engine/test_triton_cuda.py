"""The Triton kernels compiled for a CUDA GPU, against the torch backend on the CPU.

Skipped without CUDA, and under the Triton interpreter (the whole-suite conftest sets
``TRITON_INTERPRET=1``): run alone, ``TRITON_INTERPRET=0 pytest --noconftest tests/engine/test_triton_cuda.py``.
Unlike the interpreted tests (tests/engine/test_triton_kernels.py), the shapes are real-model sized:
Llama-3.2-1B's 32 query heads over 8 KV heads, contexts past 2,000 tokens, split-K decodes,
batches of dozens of sequences with shuffled block tables, in float32, bfloat16 and float16.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "0")

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from test_triton_kernels import (  # noqa: E402
    TOL,
    from_layout,
    make_meta,
    random_pool,
    run_step,
    step_inputs,
    to_layout,
)

from engine.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from engine.attention.triton_backend import ExtendLaunch, TritonAttentionBackend, interpreted  # noqa: E402
from engine.attention.triton_kernels import extend_kernel  # noqa: E402

if interpreted(extend_kernel):
    pytest.skip("triton is interpreted in this process (TRITON_INTERPRET=1)", allow_module_level=True)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (num_kv_heads, group, head_dim): Llama-3.2-1B (8 KV heads, GQA 4, 64), the 8B's head size,
# no GQA, odd groups.
SHAPES = [(8, 4, 64), (8, 4, 128), (2, 1, 64), (1, 3, 128), (4, 8, 128)]


def to_cuda(meta):
    for name in ("query_start_loc", "seq_lens", "context_lens", "slot_mapping", "block_tables"):
        setattr(meta, name, getattr(meta, name).cuda())
    return meta


def check_cuda_step(seqs, num_decodes, dtype, num_kv_heads, group, head_dim, backend=None, seed=0) -> None:
    """Reference: the torch backend on CPU copies. Tested: the compiled kernels on the GPU.
    The GPU output is poisoned with NaN before the step, so an unwritten row fails."""
    meta, k_pool, v_pool, q, k, v = step_inputs(seqs, num_decodes, dtype, num_kv_heads, group, head_dim, seed, 7)
    num_blocks = k_pool.shape[0]  # the pool size the reference metadata was drawn with
    scale = head_dim**-0.5

    ref = TorchAttentionBackend()
    kc, vc = to_layout(k_pool, ref), to_layout(v_pool, ref)
    expected = run_step(ref, q, k, v, kc, vc, meta, scale)
    k_ref, v_ref = from_layout(kc, ref), from_layout(vc, ref)

    tri = backend or TritonAttentionBackend()
    gmeta = to_cuda(make_meta(seqs, num_decodes, num_blocks, torch.Generator().manual_seed(seed)))
    kc, vc = to_layout(k_pool, tri).cuda(), to_layout(v_pool, tri).cuda()
    got = run_step(tri, q.cuda(), k.cuda(), v.cuda(), kc, vc, gmeta, scale)
    torch.cuda.synchronize()
    assert torch.equal(from_layout(kc, tri).cpu(), k_ref) and torch.equal(from_layout(vc, tri).cpu(), v_ref)
    assert got.dtype == dtype and got.shape == q.shape and not got.isnan().any()
    torch.testing.assert_close(got.cpu().float(), expected.float(), **TOL[dtype])


DECODE_LENGTHS = [1, 2, 15, 16, 17, 63, 64, 65, 100, 255, 511, 512, 513, 1000, 2049, 3000]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_kv_heads,group,head_dim", SHAPES)
def test_decode_batch(dtype, num_kv_heads, group, head_dim) -> None:
    seqs = [(n - 1, 1) for n in DECODE_LENGTHS * 2]
    check_cuda_step(seqs, len(seqs), dtype, num_kv_heads, group, head_dim)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch", [1, 3])
def test_decode_split_k_long_context(dtype, batch) -> None:
    """Small batches of long contexts split the context across programs (default backend)."""
    backend = TritonAttentionBackend()
    seqs = [(4000 + 37 * i, 1) for i in range(batch)]
    assert backend._num_splits(batch, 8, 4001) > 1
    check_cuda_step(seqs, batch, dtype, 8, 4, 64, backend=backend, seed=batch)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_kv_heads,group,head_dim", SHAPES)
def test_extend(dtype, num_kv_heads, group, head_dim) -> None:
    seqs = [(0, n) for n in (1, 15, 16, 17, 100, 513, 1500)] + [(5, 11), (21, 40), (33, 1), (16, 17), (700, 333)]
    check_cuda_step(seqs, 0, dtype, num_kv_heads, group, head_dim, seed=1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("launch", [ExtendLaunch(64, 64, 4, 3), ExtendLaunch(128, 128, 8, 3)], ids=str)
def test_extend_launches(dtype, launch) -> None:
    """Launches bench/gpu/extend_tune.py tries besides the default, on the job's shape."""
    seqs = [(0, n) for n in (1, 15, 16, 17, 100, 513, 1500)] + [(32, 180), (21, 40), (33, 1), (700, 333)]
    check_cuda_step(seqs, 0, dtype, 8, 4, 64, backend=TritonAttentionBackend(extend=launch), seed=4)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_kv_heads,group,head_dim", [(8, 4, 64), (4, 8, 128)])
def test_mixed_decodes_and_extends(dtype, num_kv_heads, group, head_dim) -> None:
    seqs = [(14, 1), (0, 1), (999, 1), (15, 1), (2047, 1), (0, 17), (31, 90), (7, 700), (1200, 64)]
    check_cuda_step(seqs, 5, dtype, num_kv_heads, group, head_dim, seed=3)


def test_padded_decode_rows_are_inert() -> None:
    """The CUDA-graph padding: seq_len 0 and slot -1 write nothing and give zeros, not NaN."""
    gen = torch.Generator().manual_seed(9)
    meta = make_meta([(20, 1), (0, 1)], 2, 6, gen)
    meta.seq_lens[1] = 0
    meta.seq_lens_host[1] = 0
    meta.slot_mapping[1] = -1
    k_pool, v_pool = (random_pool(6, 8, 64, torch.bfloat16, gen) for _ in range(2))
    q = torch.randn(2, 32, 64, generator=gen).to(torch.bfloat16).cuda()
    k, v = (torch.randn(2, 8, 64, generator=gen).to(torch.bfloat16).cuda() for _ in range(2))
    backend = TritonAttentionBackend()
    kc, vc = to_layout(k_pool, backend).cuda(), to_layout(v_pool, backend).cuda()
    got = run_step(backend, q, k, v, kc, vc, to_cuda(meta), 0.125)
    changed = [int((from_layout(c, backend).cpu() != p).sum()) for c, p in ((kc, k_pool), (vc, v_pool))]
    assert changed[0] <= 8 * 64 and changed[1] <= 8 * 64  # only row 0's slot (equal values may repeat)
    assert torch.equal(got[1].cpu(), torch.zeros_like(got[1].cpu()))
