"""compressed-tensors checkpoints (int8 W8A8, 4-bit W4A16 with and without zero points, FP8):
decoded as the package decodes them, run through the quantized CPU products, and refused in
one line when the engine does not load them."""

from __future__ import annotations

import json

import pytest
import torch
from engine_cases import random_prompts
from model_fixtures import build_tiny_llama
from quant_checkpoints import use_int4_reference, write_quantized
from safetensors import safe_open

import engine.quant.linear as quant_linear
from engine import LLM, SamplingParams
from engine.models.linear import Linear
from engine.quant.checkpoint import QuantWeight, decode
from engine.quant.linear import Int4Linear, Int8Linear, quantize_rows
from engine.quant.scheme import checkpoint_scheme

VOCAB = 49152  # the tiny models share the default model's tokenizer


@pytest.fixture(scope="module")
def float_dir(tmp_path_factory, default_model_dir):
    return build_tiny_llama(tmp_path_factory.mktemp("float"), default_model_dir, seed=3)


@pytest.fixture(scope="module")
def quant_dirs(tmp_path_factory, float_dir):
    root = tmp_path_factory.mktemp("quant")
    return {kind: write_quantized(float_dir, root / kind, kind) for kind in ("int8", "int4", "int4-asym", "fp8")}


def greedy(model_dir, quantization: str, dtype: str = "float32"):
    llm = LLM(str(model_dir), quantization=quantization, dtype=dtype, num_kv_blocks=128, max_num_batched_tokens=40)
    outs = llm.generate(random_prompts(6, seed=2), SamplingParams(max_tokens=12, temperature=0))
    return llm.engine.quantization, [o.token_ids for o in outs]


@pytest.mark.parametrize("kind", ["int8", "int4", "int4-asym", "fp8"])
def test_decoded_weights_equal_the_packages_decompression(kind, quant_dirs):
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme

    folder = quant_dirs[kind]
    qc = json.loads((folder / "config.json").read_text())["quantization_config"]
    scheme = checkpoint_scheme({"quantization_config": qc})
    group = qc["config_groups"]["group_0"]
    ct_scheme = QuantizationScheme(**{k: group[k] for k in ("targets", "weights", "input_activations")})
    compressor = BaseCompressor.get_value_from_registry(group["format"])
    prefix = "model.layers.1.mlp.down_proj."
    with safe_open(str(folder / "model.safetensors"), framework="pt") as sf:
        tensors = {k[len(prefix):]: sf.get_tensor(k) for k in sf.keys() if k.startswith(prefix)}
    expected = compressor.decompress(tensors, ct_scheme)["weight"].float()
    got = decode(tensors, scheme, prefix).dequantize()  # a QuantWeight, or an Fp8Weight for FP8
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("vnni", [True, False])
def test_int8_product_equals_the_dequantised_reference(vnni, monkeypatch):
    """Both torch paths (the C kernel off; tests/engine/test_int8_kernel.py has it): int32 sums
    through torch._int_mm (VNNI), float sums of the same rounded input through _weight_int8pack_mm."""
    import engine.quant.linear as quant_linear
    from engine.quant import int8_kernel

    monkeypatch.setattr(quant_linear, "exact_int8_gemm", lambda: vnni)
    monkeypatch.setattr(int8_kernel, "library", lambda: None)
    torch.manual_seed(0)
    qw = QuantWeight(torch.randint(-127, 128, (96, 128), dtype=torch.int8), torch.rand(96, 1) * 0.01, None, 128)
    layer = Int8Linear(qw, torch.randn(96))
    assert layer.int_gemm is vnni
    torch.testing.assert_close(layer.dequantized_weight(), qw.dequantize(), rtol=0, atol=0)
    for rows in (1, 3, 40):
        x = torch.randn(rows, 128) * 3
        xq, scale = quantize_rows(x)
        ref = (xq.float() * scale) @ qw.dequantize().t() + layer.bias
        torch.testing.assert_close(layer.forward(x), ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("c_kernel", [True, False], ids=["c-kernel", "torch-int4"])
@pytest.mark.parametrize("zero", [False, True])
def test_int4_product_equals_the_dequantised_reference(zero, c_kernel, monkeypatch):
    """With the C kernel (tests/engine/test_int4_kernel.py) the weight is the values' own, float32
    scales (the zero point's offset rounded once), and float32 rows are multiplied as they are.
    With torch's int4 kernel both paths multiply the bfloat16-rounded input by the weight with its
    scales and zeros in bfloat16; the kernel path (few rows) rounds its output to bfloat16 as well."""
    torch.manual_seed(1)
    values = torch.randint(-8, 8, (128, 128), dtype=torch.int8)
    scale = torch.rand(128, 4) * 0.1
    zp = torch.randint(-8, 8, (128, 4), dtype=torch.int8) if zero else None
    qw = QuantWeight(values, scale, zp, 32)
    if not c_kernel:  # as without a compiler, or with TOKENMILL_CPU_KERNELS=0
        monkeypatch.setattr(quant_linear, "int4_kernel", lambda: None)
    layer = Int4Linear(qw, None)
    assert layer.rounds_to_bfloat16 is (layer.kernel is None)
    if c_kernel and layer.kernel is None:
        pytest.skip("no C int4 kernel on this machine")
    if c_kernel:
        weight = qw.dequantize()
        tol = {"rtol": 2 ** -22, "atol": 2 ** -24 * 1.6} if zero else {"rtol": 0, "atol": 0}
        torch.testing.assert_close(layer.dequantized_weight(), weight, **tol)
        for rows in (1, 5, 40):
            x = torch.randn(rows, 128)
            torch.testing.assert_close(layer.forward(x), x @ layer.dequantized_weight().t(), rtol=1e-5, atol=1e-5)
        assert layer.forward(torch.randn(4, 128).bfloat16()).dtype == torch.bfloat16
        return
    zero_f = torch.zeros_like(scale) if zp is None else -zp.float() * scale
    weight = (values.float().unflatten(1, (-1, 32)) * scale.bfloat16().float().unsqueeze(-1)
              + zero_f.bfloat16().float().unsqueeze(-1)).flatten(1)
    torch.testing.assert_close(layer.dequantized_weight(), weight, rtol=0, atol=0)
    for rows in (1, 5, 40):
        x = torch.randn(rows, 128)
        ref = x.bfloat16().float() @ weight.t()
        if rows <= Int4Linear.KERNEL_MAX_ROWS:
            ref = ref.bfloat16().float()
        torch.testing.assert_close(layer.forward(x), ref, rtol=1e-2 if rows <= 16 else 1e-5, atol=1e-4)
    assert layer.forward(torch.randn(4, 128).bfloat16()).dtype == torch.bfloat16


def test_weight_only_int4_tokens_equal_the_dequantised_model(quant_dirs, monkeypatch):
    """The reference: the dequantised model given the weights the int4 products use; with
    torch's int4 kernel (no C kernel here) each linear's input rounded to bfloat16 and, at few
    rows, its output too (``use_int4_reference``)."""
    folder = quant_dirs["int4-asym"]  # zero points too; the symmetric decoding is checked above
    what, quantized = greedy(folder, "auto")
    assert what.startswith("int4 W4A16")
    auto = LLM(str(folder), num_kv_blocks=16).engine.runner.model
    weights = {n: m.dequantized_weight() for n, m in auto.named_modules() if isinstance(m, Int4Linear)}
    rounds = {m.rounds_to_bfloat16 for m in auto.modules() if isinstance(m, Int4Linear)}
    assert len(weights) == 8  # qkv, o, gate_up, down in each of 2 layers
    assert len(rounds) == 1
    use_int4_reference(monkeypatch, weights, VOCAB, rounds.pop())
    none, reference = greedy(folder, "none")
    assert none == "pack-quantized dequantised to torch.float32"
    assert quantized == reference


def test_int8_w8a8_tokens_equal_the_dequantised_model_with_rounded_activations(quant_dirs, monkeypatch):
    """The reference is the dequantised model with each linear's input rounded to int8 per token
    as W8A8 does (the LM head, ignored by the checkpoint, left float). Without that rounding this
    random model's tokens part within a few steps: its logits sit within the rounding of each other."""
    what, quantized = greedy(quant_dirs["int8"], "auto")
    assert what.startswith("int8 W8A8")
    plain = Linear.forward

    def rounded_input(self, x):
        if self.out_features == VOCAB:
            return plain(self, x)
        xq, scale = quantize_rows(x)
        return plain(self, (xq.float() * scale).to(x.dtype))

    monkeypatch.setattr(Linear, "forward", rounded_input)
    _, reference = greedy(quant_dirs["int8"], "none")
    assert quantized == reference


def test_fp8_runs_dequantised_on_the_cpu(quant_dirs):
    what, tokens = greedy(quant_dirs["fp8"], "auto", dtype="bfloat16")
    assert what == "float-quantized dequantised to torch.bfloat16"
    assert len(tokens) == 6


@pytest.mark.parametrize("qc, named", [
    ({"quant_method": "awq", "bits": 4}, "quant_method 'awq'"),
    ({"quant_method": "gptq", "bits": 4}, "quant_method 'gptq'"),
    ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "format": "nvfp4-pack-quantized",
        "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}}}},
     "format 'nvfp4-pack-quantized' with float4 tensor_group weights"),
])
def test_other_quantization_is_refused_in_one_line(qc, named, tmp_path, float_dir):
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(float_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"quantization_config": qc}))
    with pytest.raises(ValueError) as err:
        LLM(str(folder), num_kv_blocks=16)
    message = str(err.value)
    assert "\n" not in message and named in message and message.startswith("unsupported quantization: ")


def test_quantization_setting_names_its_choices():
    from engine.config import EngineConfig

    with pytest.raises(ValueError, match=r"^quantization must be one of \['auto', 'none'\], got 'int8'$"):
        EngineConfig(quantization="int8")
