"""Calibrated KV scales from a checkpoint (compressed-tensors ``kv_cache_scheme``, static per-tensor
FP8, ``self_attn.k_scale``/``v_scale`` as llm-compressor writes them): an FP8 pool divides by them,
another pool ignores them, and other KV schemes are refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from engine_cases import random_prompts
from model_fixtures import build_tiny_llama
from quant_checkpoints import write_quantized
from safetensors.torch import load_file, save_file

from engine import LLM, SamplingParams
from engine.attention.backend import Attention
from engine.kv_cache import NO_SCALE, dequantize_kv, quantize_kv
from engine.quant.scheme import checkpoint_scheme

KV_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
SCALES = [(0.05, 0.02), (0.03, 0.04)]  # (key, value) of the tiny Llama's two layers


@pytest.fixture(scope="module")
def kv_dir(tmp_path_factory, default_model_dir):
    """The tiny Llama's FP8 checkpoint plus a kv_cache_scheme and each layer's k_scale/v_scale."""
    float_dir = build_tiny_llama(tmp_path_factory.mktemp("float"), default_model_dir, seed=3)
    folder = write_quantized(float_dir, tmp_path_factory.mktemp("kv") / "fp8-kv", "fp8")
    tensors = load_file(folder / "model.safetensors")
    for i, (k, v) in enumerate(SCALES):
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor([k])
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor([v])
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["kv_cache_scheme"] = KV_SCHEME
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def run(folder, **settings):
    llm = LLM(str(folder), dtype="float32", num_kv_blocks=64, max_num_batched_tokens=24, **settings)
    layers = llm.engine.runner.model.attention_layers()
    return llm, layers


def generate(llm):
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=5)
    return llm.generate(random_prompts(4, seed=6), params)


def test_an_fp8_pool_uses_the_checkpoints_scales(kv_dir, monkeypatch):
    """The scales reach every layer, and the logprobs are those of a float32 pool written with keys
    and values rounded to E4M3 at those scales (with the scales ignored they are up to 0.4 apart)."""
    llm, layers = run(kv_dir, kv_cache_dtype="fp8")
    assert [attn.kv_scale for attn in layers] == [(pytest.approx(k), pytest.approx(v)) for k, v in SCALES]
    fp8 = generate(llm)

    forward = Attention.forward

    def rounded(self, q, k, v, meta):
        ks, vs = getattr(self, "reference_scale", NO_SCALE)
        return forward(self, q, dequantize_kv(quantize_kv(k, ks), ks, k.dtype), dequantize_kv(quantize_kv(v, vs), vs, v.dtype),
                       meta)

    monkeypatch.setattr(Attention, "forward", rounded)
    llm, layers = run(kv_dir)
    assert all(attn.kv_scale == NO_SCALE for attn in layers)  # a float32 pool: the scales are not used
    for attn, scales in zip(layers, SCALES, strict=True):
        attn.reference_scale = scales
    reference = generate(llm)
    assert [o.token_ids for o in fp8] == [o.token_ids for o in reference]
    gaps = [abs(a[t].logprob - b[t].logprob) for x, y in zip(fp8, reference, strict=True)
            for a, b in zip(x.logprobs, y.logprobs, strict=True) for t in set(a) & set(b)]
    assert len(gaps) >= 4 * 8 * 4 and max(gaps) < 1e-4


@pytest.mark.parametrize("kv, named", [
    (dict(KV_SCHEME, strategy="head"), "kv_cache_scheme float8 head (only static per-tensor FP8 KV scales)"),
    (dict(KV_SCHEME, dynamic=True), "kv_cache_scheme float8 tensor dynamic (only static"),
    (dict(KV_SCHEME, type="int"), "kv_cache_scheme int8 tensor (only static"),
])
def test_other_kv_schemes_are_refused_in_one_line(kv_dir, kv, named):
    qc = json.loads((kv_dir / "config.json").read_text())["quantization_config"]
    assert checkpoint_scheme({"quantization_config": qc}).kv_scales
    with pytest.raises(ValueError) as err:
        checkpoint_scheme({"quantization_config": qc | {"kv_cache_scheme": kv}})
    assert named in str(err.value) and "\n" not in str(err.value)


def test_a_missing_scale_is_named(kv_dir, tmp_path):
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(kv_dir, folder)
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.self_attn.v_scale"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"^kv_cache_scheme checkpoint without layer 1 v_scale$"):
        run(folder, kv_cache_dtype="fp8")
