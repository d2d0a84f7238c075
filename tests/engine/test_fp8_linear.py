"""FP8 W8A8 linears (``engine/quant/fp8_linear.py``) on the CPU: torch 2.13's CPU ``_scaled_mm``
takes float8_e4m3fn with row-wise scales, so the module that runs on CUDA runs here, against the
dequantised reference; the Triton input quantization runs under the interpreter against torch's."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton's first import (tests/conftest.py sets it too)

import pytest
import torch
from engine_cases import random_prompts
from model_fixtures import build_tiny_llama
from quant_checkpoints import write_quantized

from engine import LLM, SamplingParams
from engine.models.linear import Linear
from engine.quant.fp8_format import FP8, quantize_fp8_rows
from engine.quant.fp8_linear import Fp8Linear, Fp8Weight, quantize_fp8_channels

VOCAB = 49152


def reference(x: torch.Tensor, layer: Fp8Linear) -> torch.Tensor:
    """The dequantised product on the same rounded input, in float32 (a bias in the input's dtype)."""
    xq, xs = quantize_fp8_rows(x)
    out = (xq.float() * xs) @ layer.dequantized_weight().t()
    return out if layer.bias is None else out + layer.bias.to(x.dtype).float()


def test_rows_round_to_nearest_e4m3_with_absmax_scales() -> None:
    x = torch.tensor([[1.0, -2.0, 0.5, 448.0 / 100], [0.0, 0.0, 0.0, 0.0], [3e-3, -7e-3, 1e-3, 0.0]])
    q, scale = quantize_fp8_rows(x)
    assert q.dtype == FP8 and scale.shape == (3, 1)
    torch.testing.assert_close(scale[:, 0], torch.tensor([4.48 / 448, 1e-12 / 448, 7e-3 / 448]))
    assert torch.equal(q.float()[1], torch.zeros(4))  # padding rows: zeros, not NaN
    assert q.float().abs().amax(1)[[0, 2]].tolist() == [448.0, 448.0]
    assert q.float()[0, 0] == 96.0  # 1 / (4.48 / 448) = 100 -> 96, the nearest E4M3 value


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("bias", [False, True])
def test_fp8_linear_equals_the_dequantised_product(dtype, bias) -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 80, generator=gen) * torch.logspace(-2, 1, 96)[:, None]  # channel scales apart
    b = torch.randn(96, generator=gen).to(dtype) if bias else None  # bfloat16: added inside _scaled_mm
    layer = Fp8Linear(quantize_fp8_channels(w), b)
    x = (torch.randn(5, 80, generator=gen) * 3).to(dtype)
    got = layer(x)
    assert got.dtype == dtype and got.shape == (5, 96)
    # the product is rounded to bfloat16 (the output every CUDA row-wise kernel takes), with its bias
    torch.testing.assert_close(got.float(), reference(x, layer), rtol=2**-7, atol=2e-2)
    # and it is the quantized model, not the float one: the float product is further away
    assert (got.float() - x.float() @ w.t() - (0 if b is None else b.float())).abs().max() > 1e-2


def test_per_tensor_scale_and_3d_input() -> None:
    gen = torch.Generator().manual_seed(1)
    values = (torch.randn(32, 48, generator=gen) * 100).to(FP8)
    layer = Fp8Linear(Fp8Weight(values, torch.tensor([[0.03]])), None)
    assert torch.equal(layer.weight_scale, torch.full((1, 32), 0.03))
    x = torch.randn(2, 3, 48, generator=gen, dtype=torch.bfloat16)
    got = layer(x)
    assert got.shape == (2, 3, 32)
    torch.testing.assert_close(got.float(), reference(x.reshape(6, 48), layer).reshape(2, 3, 32), rtol=2**-7, atol=1e-3)


def test_shapes_the_gemm_does_not_take_are_refused() -> None:
    fw = quantize_fp8_channels(torch.randn(24, 40))
    with pytest.raises(ValueError, match=r"^Fp8Linear needs in and out divisible by 16, got \[24, 40\]$"):
        Fp8Linear(fw, None)


def test_triton_row_quantization_equals_torch() -> None:
    """The kernel CUDA runs (one launch per call), interpreted: the same E4M3 bits and scales."""
    pytest.importorskip("triton")
    from engine.quant.fp8_triton import quantize_rows

    gen = torch.Generator().manual_seed(2)
    x = torch.randn(9, 200, generator=gen) * torch.logspace(-4, 3, 9)[:, None]
    x[4] = 0.0
    for dtype in (torch.float32, torch.bfloat16):
        q, s = quantize_rows(x.to(dtype))
        q_ref, s_ref = quantize_fp8_rows(x.to(dtype))
        assert torch.equal(s, s_ref)
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@pytest.fixture(scope="module")
def fp8_dir(tmp_path_factory, default_model_dir):
    float_dir = build_tiny_llama(tmp_path_factory.mktemp("float"), default_model_dir, seed=3)
    return write_quantized(float_dir, tmp_path_factory.mktemp("fp8") / "fp8", "fp8")


def greedy(model_dir, quantization: str):
    llm = LLM(str(model_dir), quantization=quantization, dtype="float32", num_kv_blocks=128, max_num_batched_tokens=40)
    outs = llm.generate(random_prompts(6, seed=2), SamplingParams(max_tokens=12, temperature=0))
    model = llm.engine.runner.model
    return llm.engine.quantization, [o.token_ids for o in outs], sum(isinstance(m, Fp8Linear) for m in model.modules())


def test_fp8_checkpoint_runs_fp8_linears_where_they_are_enabled(fp8_dir, monkeypatch):
    """The loader's CUDA path, on the CPU: ``runs_as_stored`` forced true, every linear of the two
    layers (qkv, o, gate/up, down) becomes an Fp8Linear, and the tokens are those of the dequantised
    model whose linears round their input to E4M3 per token and their output to bfloat16."""
    import engine.model_loader as loader

    monkeypatch.setattr(loader, "runs_as_stored", lambda scheme, device: True)
    what, tokens, swapped = greedy(fp8_dir, "auto")
    assert what.startswith("FP8 W8A8 (torch._scaled_mm") and swapped == 2 * 4
    monkeypatch.undo()
    plain = Linear.forward

    def as_fp8(self, x):
        if self.out_features == VOCAB:  # the LM head, left float by the checkpoint
            return plain(self, x)
        xq, scale = quantize_fp8_rows(x)
        return plain(self, (xq.float() * scale).to(x.dtype)).bfloat16().to(x.dtype)

    monkeypatch.setattr(Linear, "forward", as_fp8)
    what, reference, swapped = greedy(fp8_dir, "none")
    assert what == "float-quantized dequantised to torch.float32" and swapped == 0
    assert tokens == reference


def test_fp8_checkpoint_stays_dequantised_on_the_cpu(fp8_dir):
    what, _, swapped = greedy(fp8_dir, "auto")
    assert what == "float-quantized dequantised to torch.float32" and swapped == 0
