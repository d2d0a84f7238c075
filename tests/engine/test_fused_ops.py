"""The fused C steps of the decoder layer (engine/native/fused_ops.c) against the torch
formulations they replace, and the OpenMP runtime they share with torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine import native
from engine.attention.cpu_kernels import load as load_decode_kernel
from engine.attention.cpu_kernels import write_kv
from engine.models import fused

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module", autouse=True)
def library():
    assert native.fused_ops() is not None, "fused_ops.c did not build (a C compiler is part of the dev setup)"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 7, 300])  # 300 x 576 crosses the threshold for a parallel loop
def test_add_rms_norm_matches_torch(dtype, rows) -> None:
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 576, generator=gen).to(dtype)
    residual = torch.randn(rows, 576, generator=gen).to(dtype)
    weight = (1 + 0.1 * torch.randn(576, generator=gen)).to(dtype)
    want_residual = residual + x
    want = fused.rms_norm_reference(want_residual, weight, 1e-5)
    got, got_residual = fused.rms_norm(x, weight, 1e-5, residual.clone())
    assert torch.equal(got_residual, want_residual)  # one rounding of one sum: bit-identical
    # Only the order of the sum of squares differs: float32 to a few ulps, bfloat16 to a step or two.
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=0, rtol=2 ** -6)
    torch.testing.assert_close(got, want, **tol)
    plain, same = fused.rms_norm(x, weight, 1e-5)
    assert same is x
    torch.testing.assert_close(plain, fused.rms_norm_reference(x, weight, 1e-5), **tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 5, 200])
def test_rotary_in_place_is_bit_identical_to_torch(dtype, rows) -> None:
    gen = torch.Generator().manual_seed(rows + 1)
    num_heads, num_kv_heads, head_dim = 9, 3, 64
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(rows, width, generator=gen).to(dtype)
    positions = torch.randint(0, 1000, (rows,), generator=gen)
    angles = torch.outer(torch.arange(1000.0), 1 / 10000 ** (torch.arange(0, head_dim, 2) / head_dim))
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    rotated = num_heads + num_kv_heads
    heads = qkv[:, : rotated * head_dim].reshape(rows, rotated, head_dim)
    want = fused.rotary_reference(heads, cos[positions].to(dtype).unsqueeze(1), sin[positions].to(dtype).unsqueeze(1))
    got = qkv.clone()
    fused.rotary_(got, rotated, head_dim, positions, cos, sin)
    assert torch.equal(got[:, : rotated * head_dim].reshape(rows, rotated, head_dim), want)
    assert torch.equal(got[:, rotated * head_dim :], qkv[:, rotated * head_dim :])  # values untouched


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_matches_torch_and_skips_negative_slots(dtype) -> None:
    from engine.attention.metadata import AttentionMetadata
    from engine.attention.torch_backend import TorchAttentionBackend

    gen = torch.Generator().manual_seed(3)
    kv_heads, head_dim, blocks, block_size = 3, 64, 10, 16
    qkv = torch.randn(5, (9 + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    k = qkv[:, 9 * head_dim : (9 + kv_heads) * head_dim].view(5, kv_heads, head_dim)
    v = qkv[:, (9 + kv_heads) * head_dim :].view(5, kv_heads, head_dim)
    slots = torch.tensor([17, 3, -1, 159, 40])
    k_cache = torch.zeros(kv_heads, blocks, block_size, head_dim, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    assert write_kv(k, v, k_cache, v_cache, slots)
    keep = slots >= 0
    meta = AttentionMetadata(torch.zeros(1), torch.zeros(1), torch.zeros(1), slots[keep], torch.zeros(1, 1), block_size,
                             0, 1, 1, [], [], [])
    want_k, want_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    TorchAttentionBackend(decode_kernel="torch").write_kv(k[keep], v[keep], want_k, want_v, meta)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    with pytest.raises(IndexError, match="slot 160 of row 1 is outside the pool of 160 slots"):
        write_kv(k, v, k_cache, v_cache, torch.tensor([0, 160, 1, 2, 3]))


def test_one_openmp_runtime_is_mapped() -> None:
    """The C libraries must run on torch's libgomp, not start a second pool of threads."""
    assert load_decode_kernel() is not None
    torch.ones(1 << 16).sum()  # torch's OpenMP runtime in use
    maps = Path("/proc/self/maps").read_text().splitlines()
    gomp = {line.split()[-1] for line in maps if "libgomp" in line}
    assert len(gomp) == 1, gomp


def test_bind_threads_pins_the_calling_thread() -> None:
    """In a child process: binding would pin this test process's threads too."""
    code = (
        "import os, torch; from engine.host import bind_threads_to_cores\n"
        "cpus = sorted(os.sched_getaffinity(0)); n = min(2, len(cpus)); torch.set_num_threads(n)\n"
        "assert bind_threads_to_cores(n)\n"
        "assert os.sched_getaffinity(0) == {cpus[0]}, os.sched_getaffinity(0)\n"
        "assert not bind_threads_to_cores(len(cpus) + 1)\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr
