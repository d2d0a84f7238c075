"""The prepacked Linear (engine/models/linear.py) computes what F.linear computes, in each of
its paths: float32 packed or through MKL, bfloat16 packed, bfloat16 through its float32 copy at
many rows where bfloat16 products lose; and the per-CPU rules that pick them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import native
from engine.cpu_info import cpu_flags
from engine.models import linear
from engine.models.linear import BF16_MAX_ROWS, INTEL_FLOAT32_MKL_MAX_ROWS, Linear

pytestmark = pytest.mark.skipif(not linear.can_pack(), reason="this torch build has no oneDNN linear packing")


def make(dtype: torch.dtype, bias: bool) -> Linear:
    torch.manual_seed(0)
    layer = Linear(96, 80, bias=bias).to(dtype)
    assert layer.pack()
    return layer


@pytest.mark.parametrize("rows", [1, 3, 64, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_float32_packed_matches_f_linear(rows, bias) -> None:
    layer = make(torch.float32, bias)
    x = torch.randn(rows, 96)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows", range(1, INTEL_FLOAT32_MKL_MAX_ROWS + 1))
def test_float32_few_rows_are_exactly_f_linear(rows, monkeypatch) -> None:
    """On Intel one or two rows go through MKL unpacked (faster there than the packed product):
    the very same result as F.linear, bit for bit. Forced on here, whatever this CPU is."""
    monkeypatch.setattr(linear, "float32_mkl_max_rows", lambda: INTEL_FLOAT32_MKL_MAX_ROWS)
    layer = make(torch.float32, True)
    x = torch.randn(rows, 96)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


@pytest.mark.parametrize(("vendor", "rows"), [("GenuineIntel", 2), ("AuthenticAMD", 0), ("", 0)])
def test_mkl_few_row_rule_only_on_intel(vendor, rows, monkeypatch) -> None:
    monkeypatch.setattr(linear, "cpu_vendor", lambda: vendor)
    linear.float32_mkl_max_rows.cache_clear()
    try:
        assert linear.float32_mkl_max_rows() == rows
    finally:
        linear.float32_mkl_max_rows.cache_clear()


@pytest.mark.parametrize("rows", [1, BF16_MAX_ROWS, BF16_MAX_ROWS + 1, 200])
@pytest.mark.parametrize("bias", [False, True])
def test_bfloat16_matches_float32_products_rounded(rows, bias) -> None:
    layer = make(torch.bfloat16, bias)
    x = torch.randn(rows, 96).to(torch.bfloat16)
    got = layer(x)
    assert got.dtype == torch.bfloat16
    want = F.linear(x.float(), layer.weight.float(), None if layer.bias is None else layer.bias.float())
    # float32 accumulation in both; rounding the sum to bfloat16 is the only large error
    torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=2 ** -7)


def test_bfloat16_keeps_a_float32_copy_only_where_bf16_products_lose() -> None:
    layer = make(torch.bfloat16, False)
    if linear.compute_dtype(torch.bfloat16) != torch.bfloat16:
        assert layer.packed.dtype == torch.float32 and layer.packed_f32 is None
    elif linear.bf16_beats_float32():
        assert layer.packed.dtype == torch.bfloat16 and layer.packed_f32 is None
    else:
        assert layer.packed.dtype == torch.bfloat16 and layer.packed_f32.dtype == torch.float32


@pytest.mark.parametrize(("forced", "copy"), [("bfloat16", False), ("float32", True)])
def test_bf16_products_env_overrides_the_measurement(forced, copy, monkeypatch) -> None:
    if linear.compute_dtype(torch.bfloat16) != torch.bfloat16:
        pytest.skip("no native bfloat16 products on this CPU")
    monkeypatch.setenv(linear.BF16_PRODUCTS_ENV, forced)
    linear.bf16_beats_float32.cache_clear()
    try:
        layer = make(torch.bfloat16, False)
        assert (layer.packed_f32 is not None) == copy
        x = torch.randn(BF16_MAX_ROWS + 1, 96).to(torch.bfloat16)
        want = F.linear(x.float(), layer.weight.float())
        torch.testing.assert_close(layer(x).float(), want, atol=1e-2, rtol=2 ** -7)
    finally:
        linear.bf16_beats_float32.cache_clear()


def _kernel_fn(dtype: torch.dtype):
    """few_rows.c's function for ``dtype`` wherever the CPU can run it (the rule that picks it
    is AMD-only, but the kernel itself runs on any AVX-512 CPU, and in float32 on AVX2 with FMA)."""
    lib = native.few_rows()  # it defines only the functions this CPU's vector units can run
    fn = getattr(lib, {torch.float32: "few_rows_f32", torch.bfloat16: "few_rows_bf16"}[dtype], None)
    if fn is None:
        pytest.skip("few_rows.c needs AVX-512 or AVX2+FMA (and avx512_bf16 for bfloat16) and a C compiler")
    return fn


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", range(1, 9))
def test_few_rows_kernel_matches_f_linear(dtype, rows) -> None:
    """Every row count the kernel takes, on a strided x (rows of a wider tensor), with an input
    size that leaves a remainder after the unrolled loop (224 = 3 x 64 + 32)."""
    fn = _kernel_fn(dtype)
    torch.manual_seed(rows)
    w = torch.randn(48, 224).to(dtype)
    x = torch.randn(rows, 300).to(dtype)[:, :224]
    got = linear.few_rows(x, w, fn)
    want = F.linear(x.double(), w.double())
    assert got.dtype == dtype and got.shape == (rows, 48)
    tol = 1e-5 if dtype == torch.float32 else 2 ** -7  # float32 sums; bfloat16: rounded once
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)


def test_few_rows_kernel_refuses_what_it_cannot_do() -> None:
    fn = _kernel_fn(torch.float32)
    with pytest.raises(ValueError, match=r"few_rows: unsupported product of 9 rows by \(48, 224\)"):
        linear.few_rows(torch.randn(9, 224), torch.randn(48, 224), fn)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_takes_few_rows_kernel_up_to_its_row_limit(dtype, monkeypatch) -> None:
    """Where the rule picks the kernel (AMD with AVX-512, or AVX2 in float32), a Linear sends
    products of up to this CPU's few_rows_limit rows to it and larger ones to oneDNN; forced on
    here, whatever this CPU's vendor."""
    fn = _kernel_fn(dtype)
    monkeypatch.setattr(linear, "few_rows_kernel", lambda d: fn)
    calls = []
    monkeypatch.setattr(linear, "few_rows", lambda x, w, f: calls.append(x.shape[0]) or F.linear(x, w))
    layer = make(dtype, False)
    limit = linear.few_rows_limit(dtype)
    assert limit == ((linear.AMD_FEW_ROWS_MAX if "avx512f" in cpu_flags() else linear.AMD_AVX2_FEW_ROWS_MAX)[dtype])
    for rows in (1, limit, limit + 1):
        layer(torch.randn(rows, 96).to(dtype))
    assert calls == [1, limit]
    biased = make(dtype, True)  # the kernel adds no bias: such layers never take it
    biased(torch.randn(1, 96).to(dtype))
    assert calls == [1, limit]
