"""The Triton RMSNorm and rotary kernels (CUDA's fused steps) against their torch references.

On CPU they run under the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET=1 before
triton is imported), which truncates float32 -> bfloat16 where a GPU rounds to nearest, so
bfloat16 is compared within tolerance there; on a CUDA machine run without it they are compiled:
``TRITON_INTERPRET=0 pytest --noconftest tests/engine/test_fused_triton.py``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from engine.attention.triton_backend import interpreted  # noqa: E402
from engine.models import fused, fused_triton  # noqa: E402

if interpreted(fused_triton._rms_norm_kernel):
    DEVICE = "cpu"
elif torch.cuda.is_available():
    DEVICE = "cuda"
else:
    pytest.skip("triton is compiled in this process but there is no GPU", allow_module_level=True)

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
       torch.float16: dict(atol=2e-3, rtol=2e-3)}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", [64, 96])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(dtype, hidden, with_residual) -> None:
    gen = torch.Generator().manual_seed(hidden)
    x = (torch.randn(7, hidden, generator=gen) * 3).to(dtype)
    w = torch.randn(hidden, generator=gen).to(dtype)
    res = torch.randn(7, hidden, generator=gen).to(dtype) if with_residual else None
    if res is not None:
        expected_res = res.clone().add_(x)
        expected = fused.rms_norm_reference(expected_res, w, 1e-5)
    else:
        expected_res, expected = x, fused.rms_norm_reference(x, w, 1e-5)
    d_res = res.to(DEVICE) if res is not None else None
    got, got_res = fused_triton.rms_norm(x.to(DEVICE), w.to(DEVICE), 1e-5, d_res)
    assert got.dtype == dtype
    if DEVICE == "cuda" or dtype != torch.bfloat16:  # the interpreter truncates float32 -> bfloat16
        assert torch.equal(got_res.cpu(), expected_res)  # the residual add rounds exactly as torch's
    torch.testing.assert_close(got_res.cpu(), expected_res, **TOL[dtype])
    torch.testing.assert_close(got.cpu(), expected, **TOL[dtype])
    if d_res is not None:
        assert got_res.data_ptr() == d_res.data_ptr()  # in place


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_heads,head_dim", [(6, 64), (3, 128), (5, 16)])
def test_rotary_matches_reference(dtype, num_heads, head_dim) -> None:
    gen = torch.Generator().manual_seed(head_dim)
    T, extra = 9, 2  # the value heads after the rotated ones stay untouched
    qkv = torch.randn(T, (num_heads + extra) * head_dim, generator=gen).to(dtype)
    positions = torch.randint(0, 50, (T,), generator=gen)
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(64).float(), inv)
    emb = torch.cat((freqs, freqs), -1)
    cos, sin = emb.cos(), emb.sin()

    expected = qkv.clone()
    heads = expected[:, : num_heads * head_dim].view(T, num_heads, head_dim)
    c = cos[positions].to(dtype).unsqueeze(1)
    s = sin[positions].to(dtype).unsqueeze(1)
    heads.copy_(fused.rotary_reference(heads, c, s))

    got = qkv.to(DEVICE)
    fused_triton.rotary_(got, num_heads, head_dim, positions.to(DEVICE), cos.to(DEVICE), sin.to(DEVICE))
    got = got.cpu()
    assert torch.equal(got[:, num_heads * head_dim :], qkv[:, num_heads * head_dim :])
    torch.testing.assert_close(got, expected, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", ["silu", "gelu_tanh", "gelu_pytorch_tanh"])
@pytest.mark.parametrize("rows,inter", [(5, 96), (3, 1536)])  # 1536: two column blocks, the last partial
def test_act_and_mul_matches_reference(dtype, act, rows, inter) -> None:
    from engine.models.layers import activation

    gen = torch.Generator().manual_seed(inter + rows)
    gate_up = (torch.randn(rows, 2 * inter, generator=gen) * 4).to(dtype).to(DEVICE)
    expected = activation(act)(gate_up[:, :inter]).mul(gate_up[:, inter:]).cpu()  # torch on the same device
    got = fused_triton.act_and_mul(gate_up, inter, act)
    assert got.dtype == dtype and got.shape == (rows, inter)
    got = got.cpu()
    if DEVICE == "cuda":  # compiled, each rounding is torch's: bit for bit
        assert torch.equal(got, expected)
    torch.testing.assert_close(got, expected, **TOL[dtype])


@pytest.mark.parametrize("act", ["silu", "gelu_pytorch_tanh"])
def test_gated_mlp_on_cpu_keeps_the_torch_formulation(act, monkeypatch) -> None:
    """CPU tensors never reach the Triton kernel (the interpreter would truncate bfloat16)."""
    from engine.models.layers import GatedMLP, activation

    def no_triton(*args):
        raise AssertionError("CPU tensors routed to the Triton kernel")

    monkeypatch.setattr(fused_triton, "act_and_mul", no_triton)
    gen = torch.Generator().manual_seed(3)
    mlp = GatedMLP(32, 48, act)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    mlp = mlp.to(torch.bfloat16)
    x = torch.randn(6, 32, generator=gen).to(torch.bfloat16)
    gate_up = mlp.gate_up_proj.forward(x)
    expected = mlp.down_proj.forward(activation(act)(gate_up[:, :48]).mul_(gate_up[:, 48:]))
    assert torch.equal(mlp.forward(x), expected)
    dense = gate_up.contiguous()  # the CPU product may come back column-major: try dense rows too
    expected = activation(act)(dense[:, :48]).mul_(dense[:, 48:])
    assert torch.equal(fused.act_and_mul(dense, 48, act, activation(act)), expected)
