"""The W8A8 C kernel (engine/native/int8_rows.c, engine/quant/int8_kernel.py): exact int32 sums
in every instruction set's build (each one this CPU can run, built with its -march), the row
quantization bit for bit as quantize_rows, and Int8Linear's routes to it."""

from __future__ import annotations

import pytest
import torch

from engine.cpu_info import cpu_flags
from engine.quant import int8_kernel
from engine.quant import linear as quant_linear
from engine.quant.checkpoint import QuantWeight
from engine.quant.linear import Int8Linear, quantize_rows

# -march of each build -> (what it runs, the CPU flags it needs here)
BUILDS = {
    None: (None, {"avx2"}),
    "haswell": ("avx2", {"avx2", "fma", "bmi2", "f16c"}),
    "skylake-avx512": ("avx512-bw", {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}),
    "alderlake": ("avx-vnni", {"avx2", "fma", "avx_vnni"}),
}
SHAPES = [(1, 576, 1536), (2, 3072, 576), (3, 960, 576), (4, 576, 1536), (5, 16, 64), (8, 960, 576),
          (9, 96, 128), (64, 576, 1536), (70, 48, 192)]  # (rows, out, in)


@pytest.fixture(scope="module", params=list(BUILDS), ids=lambda m: m or "native")
def lib(request):
    march = request.param
    isa, needs = BUILDS[march]
    if not needs <= cpu_flags():
        pytest.skip(f"this CPU cannot run the {march} build")
    built = int8_kernel.build(march)
    if built is None:
        pytest.skip("no C compiler (or TOKENMILL_CPU_KERNELS=0)")
    assert isa is None or int8_kernel.isa(built) == isa
    return built


def extreme_int8(rows: int, cols: int, low: int, seed: int) -> torch.Tensor:
    """Random int8 in [low, 127] with whole runs at both ends (the products and sums that would
    saturate an int16 step)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(low, 128, (rows, cols), dtype=torch.int8, generator=g)
    t[0, : cols // 2] = low
    t[-1, cols // 2:] = 127
    return t


@pytest.mark.parametrize(("rows", "out", "cols"), SHAPES)
def test_sums_equal_the_int64_reference(lib, rows, out, cols) -> None:
    q = extreme_int8(rows, cols, -127, seed=rows)  # rows: quantize_rows' range
    w = extreme_int8(out, cols, -128, seed=out)  # weights: compressed-tensors' int8 reaches -128
    w[1 % out] = -128
    got = int8_kernel.sums(lib, q, w, int8_kernel.compensation(w))
    assert torch.equal(got.long(), q.long() @ w.long().t())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_is_quantize_rows_bit_for_bit(lib, dtype) -> None:
    x = (torch.randn(37, 640) * 5).to(dtype)
    x[3] = 0.0  # a zero row: the 1e-12 floor of the scale
    x[4, :8] = torch.tensor([127, 2.5, -3.5, 0.5, -0.5, 1.5, 126.5, -126.5])  # scale exactly 1: ties
    x[4, 8:] = 0.0
    q, scale = int8_kernel.quantize(lib, x)
    ref_q, ref_scale = quantize_rows(x)
    assert torch.equal(q, ref_q) and torch.equal(scale, ref_scale)
    assert q[4, :8].tolist() == [127, 2, -4, 0, 0, 2, 126, -126]  # half to even, as torch.round


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 8, 9, 64, 70])
def test_product_is_the_exact_sums_scaled_as_torch_scales_them(lib, dtype, bias, rows) -> None:
    """The float epilogue rounds as ``sums.float() * x_scale * w_scale + bias`` does, so the
    result equals that torch expression bit for bit (the sums being exact)."""
    out, cols = 96, 192
    torch.manual_seed(rows)
    x = (torch.randn(rows, cols + 64) * 3).to(dtype)[:, 32:32 + cols]  # a row stride that is not cols
    w = extreme_int8(out, cols, -128, seed=5)
    w_scale = torch.rand(out) * 0.01
    b = torch.randn(out) if bias else None
    got = int8_kernel.linear(lib, x, w, int8_kernel.compensation(w), w_scale, b)
    q, x_scale = quantize_rows(x)
    ref = (q.long() @ w.long().t()).float() * x_scale * w_scale
    ref = (ref + b if bias else ref).to(dtype)
    assert got.dtype == dtype and torch.equal(got, ref)
    sums = (q.long() @ w.long().t()).int()
    assert torch.equal(int8_kernel.scale(lib, sums, x_scale, w_scale, b, dtype), ref)


def test_bfloat16_outputs_round_as_torch_at_ties_and_special_values(lib) -> None:
    """The vector bfloat16 store (bf16_store.h): ties to even, values that round up into the next
    power of two or to infinity (FLT_MAX), the largest value that stays finite, signed zeros,
    infinities and a subnormal bit for bit as torch's cast; NaN kept quiet with its payload's top
    bits, as bf16.h's f32_to_bf16 (without that branch 0x7fffffff would round to -0.0)."""
    one_ulp = 2.0 ** -8  # half a bfloat16 step at 1: 1 + one_ulp is a tie
    flt_max = torch.finfo(torch.float32).max
    values = [1 + one_ulp, 1 + 3 * one_ulp, -(1 + one_ulp), 2 - one_ulp, 1 + one_ulp / 2, 3.3895e38, flt_max,
              -flt_max, 0.0, -0.0, float("inf"), float("-inf"), 1e-40, -7.0, 65504.0, 0.0]
    w_scale = torch.tensor(values, dtype=torch.float32)  # sums 1, x_scale 1: the output is w_scale itself
    w_scale.view(torch.int32)[-1] = 0x7FFFFFFF  # a NaN whose payload reaches the rounding carry
    sums = torch.ones(3, 16, dtype=torch.int32)
    got = int8_kernel.scale(lib, sums, torch.ones(3, 1), w_scale, None, torch.bfloat16).view(torch.int16)
    ref = (sums[:, :-1].float() * torch.ones(3, 1) * w_scale[:-1]).to(torch.bfloat16).view(torch.int16)
    assert torch.equal(got[:, :-1], ref)
    assert got[:, -1].tolist() == [0x7FFF] * 3  # f32_to_bf16(0x7fffffff): (u >> 16) | 0x40
    assert ref[0, 6].item() == 0x7F80 and ref[0, 5].item() == 0x7F7F  # FLT_MAX overflows, 3.3895e38 does not


def test_the_kernel_refuses_shapes_it_cannot_do() -> None:
    lib = int8_kernel.library()
    if lib is None:
        pytest.skip("no kernel on this machine")
    w = torch.zeros(16, 96, dtype=torch.int8)
    with pytest.raises(ValueError, match=r"^int8_rows: a product of 2 rows by \(16, 96\) refused \(code 1\)$"):
        int8_kernel.linear(lib, torch.randn(2, 96), w, int8_kernel.compensation(w), torch.ones(16), None)
    assert not int8_kernel.fits(16, 96) and not int8_kernel.fits(24, 128) and int8_kernel.fits(16, 128)


def layer(kernel: bool, int_gemm: bool, monkeypatch, out: int = 96, cols: int = 128) -> Int8Linear:
    monkeypatch.setattr(quant_linear, "exact_int8_gemm", lambda: int_gemm)
    if not kernel:
        monkeypatch.setattr(int8_kernel, "library", lambda: None)
    elif int8_kernel.library() is None:
        pytest.skip("no kernel on this machine")
    torch.manual_seed(0)
    qw = QuantWeight(extreme_int8(out, cols, -128, seed=1), torch.rand(out, 1) * 0.01, None, cols)
    m = Int8Linear(qw, torch.randn(out))
    assert (m.kernel is not None) is kernel and m.int_gemm is int_gemm
    return m


@pytest.mark.parametrize(("kernel", "int_gemm"), [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_linear_equals_the_dequantised_reference_on_every_route(kernel, int_gemm, dtype, monkeypatch) -> None:
    """Kernel (few rows; every row count without VNNI), _int_mm with the C quantize and scaling,
    and the torch-only routes: all the rounded rows times the dequantised weight."""
    if int_gemm and not quant_linear.exact_int8_gemm():  # (not patched yet)
        pytest.skip("torch._int_mm is exact only on VNNI CPUs")
    m = layer(kernel, int_gemm, monkeypatch)
    for rows in [1, 2, 3, 4, 5, 8, int8_kernel.VNNI_MAX_ROWS, int8_kernel.VNNI_MAX_ROWS + 1, 64, 200]:
        x = (torch.randn(rows, 128) * 3).to(dtype)
        q, scale = quantize_rows(x)
        ref = (q.float() * scale) @ m.dequantized_weight().t() + m.bias
        got = m(x)
        assert got.dtype == dtype
        tol = {"rtol": 1e-5, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 8e-3, "atol": 1e-2}
        torch.testing.assert_close(got.float(), ref.to(dtype).float(), **tol)


@pytest.mark.parametrize("int_gemm", [True, False])
def test_int8_linear_sends_few_rows_to_the_kernel(int_gemm, monkeypatch) -> None:
    """With VNNI the kernel takes up to VNNI_MAX_ROWS rows and _int_mm the rest; without, the
    kernel takes them all (oneDNN's AVX2 int8 GEMM is not exact)."""
    m = layer(True, int_gemm, monkeypatch)
    calls: list[int] = []
    real = int8_kernel.linear
    monkeypatch.setattr(int8_kernel, "linear", lambda lib, x, *a: calls.append(x.shape[0]) or real(lib, x, *a))
    for rows in (1, int8_kernel.VNNI_MAX_ROWS, int8_kernel.VNNI_MAX_ROWS + 1, 300):
        m(torch.randn(rows, 128))
    limit = int8_kernel.VNNI_MAX_ROWS
    assert calls == ([1, limit] if int_gemm else [1, limit, limit + 1, 300])
