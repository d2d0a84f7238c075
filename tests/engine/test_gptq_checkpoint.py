"""A W4A16 checkpoint as llm-compressor's GPTQ writes it (group 32, zero points, ``actorder:
weight``, its scales and zero points chosen while the rounding error is compensated), kept in
tests/data (a 2-layer random Llama, 512-token vocabulary, made by
``bench/quant_calibrated.py --tiny``): it runs as int4 products, its weights decode exactly as
compressed-tensors decompresses them, and its tokens equal the dequantised model's.

llm-compressor no longer writes ``actorder: group`` (the ``weight_g_idx`` column map; removed from
compressed-tensors in 2026-08): activation order is applied while quantizing and leaves the
checkpoint in the plain group layout, so nothing beyond ``pack-quantized`` is needed to load it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from quant_checkpoints import use_int4_reference
from safetensors import safe_open

from engine import LLM, SamplingParams
from engine.quant.checkpoint import decode
from engine.quant.linear import Int4Linear
from engine.quant.scheme import QuantScheme, WeightFormat, checkpoint_scheme

FIXTURE = Path(__file__).resolve().parent.parent / "data" / "gptq-w4a16-g32-asym"
VOCAB = 512


def _greedy(quantization: str) -> tuple[str, list[list[int]]]:
    rng = random.Random(5)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (1, 7, 20, 33, 64)]
    llm = LLM(str(FIXTURE), quantization=quantization, dtype="float32", num_kv_blocks=64, max_num_batched_tokens=40)
    outs = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    return llm.engine.quantization, [o.token_ids for o in outs]


def test_the_gptq_checkpoint_is_read_as_group_wise_int4_with_zero_points():
    qc = json.loads((FIXTURE / "config.json").read_text())["quantization_config"]
    assert qc["config_groups"]["group_0"]["weights"]["actorder"] == "weight"
    assert "GPTQModifier" in (FIXTURE / "recipe.yaml").read_text()
    scheme = checkpoint_scheme({"quantization_config": qc})
    assert scheme == QuantScheme(WeightFormat.INT4, "pack-quantized", 32, False, ("Linear",), ("lm_head",))


def test_a_g_idx_checkpoint_is_refused_in_one_line():
    """``actorder: group`` (older llm-compressor) stores a ``weight_g_idx`` column map the int4
    products do not apply; it is named, not mis-read."""
    from engine.model_errors import UnsupportedQuantization

    qc = json.loads((FIXTURE / "config.json").read_text())["quantization_config"]
    qc["config_groups"]["group_0"]["weights"]["actorder"] = "group"
    with pytest.raises(UnsupportedQuantization, match=r"^unsupported quantization: compressed-tensors "
                                                      r"actorder 'group' \(weight_g_idx column groups\); "):
        checkpoint_scheme({"quantization_config": qc})


def test_gptq_weights_decode_as_the_package_decompresses_them():
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme

    qc = json.loads((FIXTURE / "config.json").read_text())["quantization_config"]
    group = qc["config_groups"]["group_0"]
    ct_scheme = QuantizationScheme(**{k: group[k] for k in ("targets", "weights", "input_activations")})
    compressor = BaseCompressor.get_value_from_registry(group["format"])
    scheme = checkpoint_scheme({"quantization_config": qc})
    with safe_open(str(FIXTURE / "model.safetensors"), framework="pt") as sf:
        names = sf.keys()
        prefixes = sorted({n.rpartition(".")[0] for n in names if n.endswith(".weight_packed")})
        assert len(prefixes) == 14  # q, k, v, o, gate, up, down in 2 layers; lm_head left float
        for prefix in prefixes:
            tensors = {n.rpartition(".")[2]: sf.get_tensor(n) for n in names if n.rpartition(".")[0] == prefix}
            expected = compressor.decompress(tensors, ct_scheme)["weight"]  # bfloat16, as its scales
            got = decode(tensors, scheme, prefix)
            assert got.zero is not None and got.group_size == 32 and expected.dtype == torch.bfloat16
            # the package multiplies in bfloat16; ours in float32, the same once rounded to it
            torch.testing.assert_close(got.dequantize().bfloat16(), expected, rtol=0, atol=0)


def test_gptq_int4_tokens_equal_the_dequantised_model(monkeypatch):
    """The reference: the dequantised model given the weights the int4 products use; with
    torch's int4 kernel (no C kernel here) each linear's input rounded to bfloat16 and, at few
    rows, its output too (``use_int4_reference``)."""
    what, quantized = _greedy("auto")
    assert what == "int4 W4A16 (group 32, with zero points)"
    model = LLM(str(FIXTURE), num_kv_blocks=16).engine.runner.model
    weights = {n: m.dequantized_weight() for n, m in model.named_modules() if isinstance(m, Int4Linear)}
    rounds = {m.rounds_to_bfloat16 for m in model.modules() if isinstance(m, Int4Linear)}
    assert len(weights) == 8  # qkv, o, gate_up, down in each of 2 layers
    assert len(rounds) == 1
    use_int4_reference(monkeypatch, weights, VOCAB, rounds.pop())
    none, reference = _greedy("none")
    assert none == "pack-quantized dequantised to torch.float32"
    assert quantized == reference
