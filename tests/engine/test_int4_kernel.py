"""The C int4 product (engine/native/int4_rows.c): in this CPU's build and in an AVX2 one (built
with ``-march=haswell``, which runs here too), the weight it builds is ``QuantWeight.dequantize()``
bit for bit where the stored products are exact (GGUF's types, symmetric scales), and its products
are that weight's float products within float32 summation error; ``Int4Linear`` takes it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import native
from engine.quant import int4_kernel as ik
from engine.quant.checkpoint import QuantWeight
from engine.quant.linear import Int4Linear

OUT, COLS = 96, 192  # 6 tiles of 16 (12 of 8), 3 blocks of 64 columns
HASWELL = [f if f != "-march=native" else "-march=haswell" for f in native.FLAGS]


@pytest.fixture(scope="module", params=["native", "avx2"])
def kernel(request) -> ik.Int4Kernel:
    built = ik.build() if request.param == "native" else ik.build(HASWELL, "int4_rows_haswell")
    if built is None:
        pytest.skip("the int4 kernel needs a C compiler and AVX-512 or AVX2 with FMA")
    assert built.out_tile == (8 if request.param == "avx2" else built.out_tile)
    return built


def weights(kind: str, seed: int = 0, out: int = OUT, cols: int = COLS, group: int = 32) -> QuantWeight:
    """A 4-bit weight as each source stores it: GGUF Q4_1 / Q4_K (zero -8, float16-exact scale
    and offset), Q4_0 (no zero), and compressed-tensors symmetric / asymmetric (any float32 scale)."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(-8, 8, (out, cols), dtype=torch.int8, generator=g)
    groups = (out, cols // group)
    scale = torch.rand(groups, generator=g) * 0.02
    if kind in ("q4_1", "q4_0"):
        scale = scale.half().float()
    if kind == "q4_k":  # d * sc: a float16 times a 6-bit integer
        scale = scale.half().float() * torch.randint(0, 64, groups, generator=g).float()
    offset = (torch.rand(groups, generator=g) * 0.1 - 0.05).half().float() if kind in ("q4_1", "q4_k") else None
    zero = torch.full(groups, -8, dtype=torch.int8) if offset is not None else None
    if kind == "asym":
        zero = torch.randint(-8, 8, groups, dtype=torch.int8, generator=g)
    return QuantWeight(values, scale, zero, group, offset)


@pytest.mark.parametrize("kind", ["q4_1", "q4_k", "q4_0", "sym", "asym"])
def test_weight_is_the_dequantised_one(kernel, kind):
    qw = weights(kind)
    got = kernel.dequantize(*kernel.pack(qw))
    if kind == "asym":  # the offset -(8 + zero) * scale is rounded once more: an ulp of it (<= 0.3)
        torch.testing.assert_close(got, qw.dequantize(), rtol=2 ** -22, atol=2 ** -24 * 0.6)
    else:
        assert torch.equal(got, qw.dequantize())


@pytest.mark.parametrize("kind", ["q4_1", "q4_k", "sym", "asym"])
def test_bfloat16_weight_is_the_float32_one_rounded_as_torch_rounds_it(kernel, kind):
    """What Int4Linear multiplies many bfloat16 rows by: written in one pass, bit for bit the cast."""
    packed, sz = kernel.pack(weights(kind))
    got = kernel.dequantize(packed, sz, torch.bfloat16)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.view(torch.int16), kernel.dequantize(packed, sz).to(torch.bfloat16).view(torch.int16))


def test_group_of_128_takes_one_scale_per_four_blocks_of_32(kernel):
    qw = weights("sym", group=128, cols=256)
    assert torch.equal(kernel.dequantize(*kernel.pack(qw)), qw.dequantize())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [*range(1, 10), 16, 17])  # every chunk size of 8, and two chunks
def test_product_is_the_dequantised_weights_product(kernel, dtype, rows):
    """On a strided x (rows of a wider tensor): float32 sums, a bfloat16 result rounded once."""
    qw = weights("q4_1", seed=rows)
    packed, sz = kernel.pack(qw)
    x = torch.randn(rows, COLS + 40, generator=torch.Generator().manual_seed(rows)).to(dtype)[:, :COLS]
    got = kernel.product(x, packed, sz, OUT)
    want = F.linear(x.double(), qw.dequantize().double())
    assert got.dtype == dtype and got.shape == (rows, OUT)
    if dtype == torch.float32:
        bound = 1e-6 * (x.double().abs() @ qw.dequantize().double().abs().t()) + 1e-7
    else:
        bound = 2 ** -8 * want.abs() + 1e-6  # half a bfloat16 ulp of the result, plus float32 sums
    assert bool(((got.double() - want).abs() <= bound).all())


def test_shapes_it_does_not_take_are_refused(kernel):
    assert kernel.takes(OUT, COLS, 32)
    assert not kernel.takes(OUT, 96, 32)  # not whole 64-column blocks
    assert not kernel.takes(OUT + 4, COLS, 32)  # not whole tiles of outputs
    assert not kernel.takes(OUT, COLS, 16)  # groups finer than a stored scale
    packed, sz = kernel.pack(weights("sym"))
    with pytest.raises(ValueError, match=r"^int4 kernel: unsupported product of 2 rows by 96x160$"):
        kernel.product(torch.randn(2, 160), packed[:, :80].contiguous(), sz, OUT)
    with pytest.raises(ValueError, match="not whole 64-column blocks"):
        kernel.pack(weights("sym", cols=96))


def test_no_kernel_without_cpu_kernels(monkeypatch):
    monkeypatch.setenv("TOKENMILL_CPU_KERNELS", "0")
    assert ik.build() is None


def test_int4_linear_runs_the_kernel_and_its_weight_beyond(monkeypatch):
    """Up to C_MAX_ROWS rows (C_MAX_ROWS_16BIT for bfloat16 rows) the kernel; beyond, the same
    weight written out and multiplied by MKL / oneDNN (in bfloat16 where the engine's bfloat16
    products are the fast ones: the weight rounded to bfloat16 there, as the dequantised model's)."""
    if ik.int4_kernel() is None:
        pytest.skip("no int4 kernel on this machine")
    qw = weights("q4_k")
    bias = torch.randn(OUT)
    layer = Int4Linear(qw, bias)
    assert layer.kernel is not None and not layer.rounds_to_bfloat16
    assert layer.packed.dtype == torch.uint8 and layer.scales_and_zeros.dtype == torch.float32
    assert torch.equal(layer.dequantized_weight(), qw.dequantize())
    calls = []
    product = layer.kernel.product
    monkeypatch.setattr(layer.kernel, "product", lambda x, *a: calls.append(x.shape[0]) or product(x, *a))
    w = qw.dequantize().double()
    for dtype, limit in ((torch.float32, Int4Linear.C_MAX_ROWS), (torch.bfloat16, Int4Linear.C_MAX_ROWS_16BIT)):
        for rows in (1, limit, limit + 1, 300):  # 300: past WEIGHT_MAJOR_MAX_ROWS
            x = torch.randn(rows, COLS).to(dtype)
            got = layer(x)
            assert got.dtype == dtype
            want = F.linear(x.double(), w, bias.double())
            sums = x.double().abs() @ w.abs().t() + bias.double().abs()
            if dtype == torch.float32:
                assert bool(((got.double() - want).abs() <= 1e-6 * sums).all())  # float32 sums
            else:  # the result rounded once; beyond the kernel, each weight too
                assert bool(((got.double() - want).abs() <= 2 ** -8 * (want.abs() + sums)).all())
    assert calls == [1, Int4Linear.C_MAX_ROWS, 1, Int4Linear.C_MAX_ROWS_16BIT]


def test_int4_linear_falls_back_to_torchs_kernel_where_the_shape_does_not_fit():
    layer = Int4Linear(weights("sym", out=64, cols=96), None)
    assert layer.kernel is None and layer.rounds_to_bfloat16
    assert layer.scales_and_zeros.dtype == torch.bfloat16  # torch's layout: [groups, out, 2]
    assert layer(torch.randn(3, 96)).shape == (3, 64)
