"""The few-row C product of group-wise int8 weights (engine/native/group_int8_rows.c): the float
product of the dequantised weight up to the order of float32 sums, in this CPU's build and the
AVX2 one; GroupInt8Linear sends 1..MAX_ROWS rows to it and more to the torch route."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.cpu_info import cpu_flags
from engine.quant import group_int8_kernel
from engine.quant.checkpoint import QuantWeight
from engine.quant.group_int8 import GroupInt8Linear

OUT, COLS = 96, 576


@pytest.fixture(scope="module", params=[None, "haswell"], ids=["native", "haswell"])
def lib(request):
    if request.param == "haswell" and not {"avx2", "fma", "f16c", "bmi2"} <= cpu_flags():
        pytest.skip("this CPU cannot run the AVX2 build")
    built = group_int8_kernel.build(request.param)
    if built is None:
        pytest.skip("no C compiler, or no AVX2 with FMA")
    return built


def q8_0(seed: int) -> QuantWeight:
    """Q8_0's shape of weight: int8 values in [-127, 127] with -128 too, a float16 scale per 32."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(-128, 128, (OUT, COLS), dtype=torch.int8, generator=g)
    scale = (torch.rand(OUT, COLS // 32, generator=g) * 0.02).half().float()
    return QuantWeight(values, scale, None, 32)


def assert_sums_close(got: torch.Tensor, ref: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    """float32 sums in another order: apart by a few ulps of the sum of the terms' magnitudes."""
    bound = 4e-6 * F.linear(x.float().abs(), w.abs())
    assert bool(((got - ref).abs() <= bound).all()), float(((got - ref).abs() / bound).max())


@pytest.mark.parametrize("rows", range(1, group_int8_kernel.MAX_ROWS + 1))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_product_is_the_dequantised_product(lib, rows, dtype) -> None:
    """float32 rows: F.linear by the float32 dequantised weight; bfloat16 rows: by that weight
    rounded to bfloat16, float32 sums rounded once (so within one bfloat16 rounding)."""
    layer = GroupInt8Linear(q8_0(rows), None)
    assert layer.scale.dtype == torch.float16
    x = torch.randn(rows, COLS + 32, generator=torch.Generator().manual_seed(rows))[:, 16:16 + COLS].to(dtype)
    got = group_int8_kernel.product(lib, x, layer.values, layer.scale)
    w = layer.dequantized_weight()
    ref = F.linear(x.float(), w if dtype == torch.float32 else w.bfloat16().float())
    assert got.dtype == dtype
    if dtype == torch.float32:
        assert_sums_close(got, ref, x, w)
    else:
        torch.testing.assert_close(got.float(), ref.bfloat16().float(), rtol=8e-3, atol=1e-3)


def test_group_int8_linear_takes_the_kernel_up_to_max_rows(monkeypatch) -> None:
    if group_int8_kernel.library() is None:
        pytest.skip("no kernel on this machine")
    layer = GroupInt8Linear(q8_0(0), torch.randn(OUT))
    assert layer.kernel is not None
    calls: list[int] = []
    real = group_int8_kernel.product
    monkeypatch.setattr(group_int8_kernel, "product", lambda lib, x, *a: calls.append(x.shape[0]) or real(lib, x, *a))
    w = layer.dequantized_weight()
    for rows in (1, group_int8_kernel.MAX_ROWS, group_int8_kernel.MAX_ROWS + 1):
        x = torch.randn(rows, COLS)
        assert_sums_close(layer(x), F.linear(x, w, layer.bias), x, w)
    assert calls == [1, group_int8_kernel.MAX_ROWS]


def test_float32_scales_stay_on_the_torch_route() -> None:
    """The kernel reads float16 scales as stored; scales that are not float16 values (not GGUF)
    keep GroupInt8Linear's float32 scales and its torch route."""
    qw = q8_0(1)
    qw = QuantWeight(qw.values, qw.scale + 1e-6, None, 32)
    layer = GroupInt8Linear(qw, None)
    assert layer.scale.dtype == torch.float32 and layer.kernel is None
