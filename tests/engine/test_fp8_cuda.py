"""The FP8 path compiled for a CUDA GPU (compute capability 8.9+): ``Fp8Linear`` through CUDA's
row-wise ``_scaled_mm``, the Triton input quantization, and the Triton kernels on an FP8 KV pool,
each against its torch reference on the CPU. Skipped without such a GPU and under the Triton
interpreter; run alone: ``TRITON_INTERPRET=0 pytest --noconftest tests/engine/test_fp8_cuda.py``
(``bench/gpu/fp8_check.sh`` does)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "0")

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
    pytest.skip("no CUDA device of compute capability 8.9+", allow_module_level=True)

from test_triton_cuda import to_cuda  # noqa: E402
from test_triton_kernels import TOL, from_layout, step_inputs, to_layout  # noqa: E402

from engine.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from engine.attention.triton_backend import DecodeLaunch, TritonAttentionBackend, interpreted  # noqa: E402
from engine.attention.triton_kernels import extend_kernel  # noqa: E402
from engine.kv_cache import quantize_kv  # noqa: E402
from engine.quant.fp8_format import quantize_fp8_rows  # noqa: E402
from engine.quant.fp8_linear import Fp8Linear, quantize_fp8_channels  # noqa: E402
from engine.quant.fp8_triton import quantize_rows  # noqa: E402

if interpreted(extend_kernel):
    pytest.skip("triton is interpreted in this process (TRITON_INTERPRET=1)", allow_module_level=True)


@pytest.mark.parametrize("rows", [1, 7, 256, 2048])
@pytest.mark.parametrize("out_in", [(3072, 2048), (2048, 8192), (6144, 4096)], ids=str)
def test_fp8_linear_on_cuda_matches_the_cpu_reference(rows, out_in) -> None:
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(*out_in, generator=gen) * 0.02
    bias = torch.randn(out_in[0], generator=gen).bfloat16()  # a bfloat16 model's bias: inside _scaled_mm
    cpu = Fp8Linear(quantize_fp8_channels(w), bias)
    gpu = Fp8Linear(quantize_fp8_channels(w), bias).cuda()
    x = torch.randn(rows, out_in[1], generator=gen).bfloat16()
    expected = cpu(x).float()
    got = gpu(x.cuda())
    assert got.dtype == torch.bfloat16 and not got.isnan().any()
    torch.testing.assert_close(got.float().cpu(), expected, rtol=2**-6, atol=2e-2)


def test_triton_row_quantization_on_cuda_equals_torch() -> None:
    x = torch.randn(300, 14336, generator=torch.Generator().manual_seed(0)).bfloat16() * 5
    x[7] = 0
    q, s = quantize_rows(x.cuda())
    q_ref, s_ref = quantize_fp8_rows(x)
    assert torch.equal(s.cpu(), s_ref)
    assert torch.equal(q.cpu().view(torch.uint8), q_ref.view(torch.uint8))


SEQS = [(n - 1, 1) for n in (1, 17, 100, 600, 2100, 4075)] + [(0, 300), (45, 200), (1000, 37), (0, 1)]


@pytest.mark.parametrize("kv_scale", [(1.0, 1.0), (0.37, 2.5)])
@pytest.mark.parametrize("num_kv_heads,group,head_dim", [(8, 4, 64), (8, 4, 128)])
@pytest.mark.parametrize("splits", [False, True])
def test_fp8_pool_on_cuda_matches_the_torch_backend(kv_scale, num_kv_heads, group, head_dim, splits) -> None:
    """bfloat16 queries over an FP8 pool: the compiled write stores torch's E4M3 bits, and the
    decode (split-K or not) and extend kernels give the torch backend's output."""
    dtype = torch.bfloat16
    meta, k_pool, v_pool, q, k, v = step_inputs(SEQS, 6, dtype, num_kv_heads, group, head_dim, seed=1, spare_blocks=7)
    ref = TorchAttentionBackend(compile_decode=False)
    kc, vc = to_layout(quantize_kv(k_pool, kv_scale[0]), ref), to_layout(quantize_kv(v_pool, kv_scale[1]), ref)
    ref.write_kv(k, v, kc, vc, meta, kv_scale)
    expected = ref.attend(q, k, v, kc, vc, meta, head_dim**-0.5, None, kv_scale)

    launch = DecodeLaunch(min_partition=128, target_programs=1 << 16) if splits else DecodeLaunch(max_splits=1)
    backend = TritonAttentionBackend(decode=launch)
    kg = to_layout(quantize_kv(k_pool, kv_scale[0]), backend).cuda()
    vg = to_layout(quantize_kv(v_pool, kv_scale[1]), backend).cuda()
    meta = to_cuda(meta)
    backend.write_kv(k.cuda(), v.cuda(), kg, vg, meta, kv_scale)
    got = backend.attend(q.cuda(), k.cuda(), v.cuda(), kg, vg, meta, head_dim**-0.5, None, kv_scale)
    assert torch.equal(from_layout(kg.cpu(), backend).view(torch.uint8), from_layout(kc, ref).view(torch.uint8))
    assert torch.equal(from_layout(vg.cpu(), backend).view(torch.uint8), from_layout(vc, ref).view(torch.uint8))
    assert got.dtype == dtype and not got.isnan().any()
    torch.testing.assert_close(got.cpu().float(), expected.float(), **TOL[dtype])
