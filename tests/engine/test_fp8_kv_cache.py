"""The FP8 KV cache (``kv_cache_dtype="fp8"``, ``engine/kv_cache.py``): the option, the pool's size
in blocks, the round trip, the torch backend against a float pool holding the same values, the
Triton kernels (interpreted) against the torch backend, and a random model's logprobs."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton's first import (tests/conftest.py sets it too)

import pytest
import torch
from engine_cases import random_prompts
from test_triton_kernels import TOL, from_layout, run_step, step_inputs, to_layout

from engine import LLM, LLMEngine, SamplingParams
from engine.attention.torch_backend import TorchAttentionBackend
from engine.config import EngineConfig
from engine.kv_cache import KV_FP8, blocks_from_budget, bytes_per_block, dequantize_kv, quantize_kv


def test_unknown_kv_cache_dtype_is_one_line() -> None:
    with pytest.raises(ValueError) as err:
        EngineConfig(kv_cache_dtype="fp16")
    assert str(err.value) == "kv_cache_dtype must be one of ['auto', 'fp8'], got 'fp16'"


def test_fp8_pool_holds_twice_the_blocks_of_bfloat16(tiny_model_dir) -> None:
    per_block = {d: bytes_per_block(2, 16, 2, 32, d) for d in (torch.bfloat16, KV_FP8)}
    assert per_block[torch.bfloat16] == 2 * per_block[KV_FP8] == 2 * (2 * 2 * 16 * 2 * 32)
    assert blocks_from_budget(3e6, per_block[KV_FP8]) == 2 * blocks_from_budget(3e6, per_block[torch.bfloat16])

    def pool(kv_cache_dtype: str):
        engine = LLMEngine(EngineConfig(model=str(tiny_model_dir), attention_backend="triton", device="cpu",
                                        dtype="bfloat16", kv_cache_memory_gb=1000 * 4096 / 2**30,
                                        kv_cache_dtype=kv_cache_dtype, max_model_len=128))
        pool = engine.runner.kv_pool
        return engine.num_kv_blocks, pool.dtype, pool.numel() * pool.element_size()

    # the tiny Llama: 2 layers, 2 KV heads of 16, blocks of 16 -> 4,096 bytes a block in bfloat16
    assert pool("auto") == (1000, torch.bfloat16, 1000 * 4096)
    assert pool("fp8") == (2000, KV_FP8, 1000 * 4096)


def test_round_trip_is_e4m3_rounding_times_the_scale() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=gen) * 20
    for scale in (1.0, 0.37, 4.0):
        q = quantize_kv(x, scale)
        assert q.dtype == KV_FP8
        back = dequantize_kv(q, scale, torch.float32)
        inside = x.abs() < 448 * scale
        # 3 mantissa bits: at most half a step, 2^-4 relative (above E4M3's subnormals, 2^-6 * scale)
        normal = inside & (x.abs() > 2**-6 * scale)
        assert ((back - x).abs() <= x.abs() * 2**-4 + 1e-7)[normal].all()
        assert (back - x).abs()[inside].max() > 0  # it is rounded
        assert torch.equal(back[~inside].abs(), torch.full_like(back[~inside], 448 * scale))  # saturated
    assert torch.equal(dequantize_kv(x.bfloat16(), 0.5, torch.float32), x.bfloat16().float())  # not FP8: as is


SEQS = [(14, 1), (0, 1), (99, 1), (15, 1), (0, 17), (31, 9), (7, 70)]  # 4 decodes, then prefill chunks


@pytest.mark.parametrize("kv_scale", [(1.0, 1.0), (0.37, 2.5)])
def test_torch_backend_attends_to_the_dequantised_pool(kv_scale) -> None:
    """FP8 pool: written as ``quantize_kv``, and the output is what a float32 pool holding the
    dequantised values (the fresh keys included) gives."""
    meta, k_pool, v_pool, q, k, v = step_inputs(SEQS, 4, torch.float32, 2, 3, 64, seed=3, spare_blocks=3)
    backend = TorchAttentionBackend(compile_decode=False)
    kc, vc = to_layout(quantize_kv(k_pool, kv_scale[0]), backend), to_layout(quantize_kv(v_pool, kv_scale[1]), backend)
    got = run_step_scaled(backend, q, k, v, kc, vc, meta, kv_scale)
    bs = meta.block_size
    slots = meta.slot_mapping
    k_written, v_written = from_layout(kc, backend)[slots // bs, slots % bs], from_layout(vc, backend)[slots // bs, slots % bs]
    assert torch.equal(k_written.view(torch.uint8), quantize_kv(k, kv_scale[0]).view(torch.uint8))
    assert torch.equal(v_written.view(torch.uint8), quantize_kv(v, kv_scale[1]).view(torch.uint8))

    ref = TorchAttentionBackend(decode_kernel="torch", compile_decode=False)
    kf = to_layout(dequantize_kv(from_layout(kc, backend), kv_scale[0], torch.float32), ref)
    vf = to_layout(dequantize_kv(from_layout(vc, backend), kv_scale[1], torch.float32), ref)
    k_seen, v_seen = dequantize_kv(k_written, kv_scale[0], torch.float32), dequantize_kv(v_written, kv_scale[1], torch.float32)
    expected = run_step(ref, q, k_seen, v_seen, kf, vf, meta, 0.125)
    torch.testing.assert_close(got, expected, **TOL[torch.float32])
    plain = run_step(ref, q, k, v, to_layout(k_pool, ref), to_layout(v_pool, ref), meta, 0.125)
    assert (got - plain).abs().max() > 1e-3  # the rounding shows: not the float pool


def run_step_scaled(backend, q, k, v, k_cache, v_cache, meta, kv_scale, scale=0.125):
    backend.write_kv(k, v, k_cache, v_cache, meta, kv_scale)
    return backend.attend(q, k, v, k_cache, v_cache, meta, scale, None, kv_scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kv_scale", [(1.0, 1.0), (0.37, 2.5)])
def test_triton_fp8_pool_matches_the_torch_backend(dtype, kv_scale) -> None:
    """Interpreted Triton kernels: the same E4M3 bits written, and the same outputs (decodes,
    split-K included via a 3-split launch, and prefill chunks over cached FP8 context)."""
    from engine.attention.triton_backend import DecodeLaunch, TritonAttentionBackend

    meta, k_pool, v_pool, q, k, v = step_inputs(SEQS, 4, dtype, 2, 3, 64, seed=5, spare_blocks=3)
    results = []
    split = DecodeLaunch(block_n=32, min_partition=32, target_programs=1 << 16)
    for backend in (TorchAttentionBackend(compile_decode=False), TritonAttentionBackend(decode=split)):
        kc = to_layout(quantize_kv(k_pool, kv_scale[0]), backend)
        vc = to_layout(quantize_kv(v_pool, kv_scale[1]), backend)
        out = run_step_scaled(backend, q, k, v, kc, vc, meta, kv_scale)
        results.append((out, from_layout(kc, backend).view(torch.uint8), from_layout(vc, backend).view(torch.uint8)))
    (expected, k_ref, v_ref), (got, k_got, v_got) = results
    assert torch.equal(k_got, k_ref) and torch.equal(v_got, v_ref)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), expected.float(), **TOL[dtype])


def test_triton_write_rounds_as_torch_at_the_edges() -> None:
    """Ties to even (17 -> 16, 19 -> 20), a carry into the next power of two (-31.1 -> -32: the
    interpreter's own conversion gives -16), subnormals, -0 and saturation, bit for bit."""
    from engine.attention.triton_backend import TritonAttentionBackend

    edges = torch.tensor([17.0, 19.0, -31.1, 7.9, 2**-9 * 2.5, -1e-9, -0.0, 0.0, 500.0, -1e4, 0.015625, 240.0, 232.0,
                          -2**-7 * 1.0625, 447.0, 3.3])
    key = edges.repeat(8).reshape(2, 1, 64)  # 2 tokens, 1 head of 64
    meta = step_inputs([(0, 2)], 0, torch.float32, 1, 1, 64, seed=0, spare_blocks=0)[0]
    backend = TritonAttentionBackend()
    k_cache = torch.zeros(backend.kv_cache_shape(1, 16, 1, 64), dtype=KV_FP8)
    v_cache = torch.zeros_like(k_cache)
    backend.write_kv(key, key * 3, k_cache, v_cache, meta, (1.0, 3.0))
    slots = meta.slot_mapping
    for cache, x, scale in ((k_cache, key, 1.0), (v_cache, key * 3, 3.0)):
        written = cache[slots // 16, slots % 16].view(torch.uint8)
        assert torch.equal(written, quantize_kv(x, scale).view(torch.uint8))
    assert quantize_kv(edges, 1.0).float()[:4].tolist() == [16.0, 20.0, -32.0, 8.0]


def logprob_runs(model_dir, **settings):
    llm = LLM(model=str(model_dir), device="cpu", num_kv_blocks=64, max_num_batched_tokens=24, **settings)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=5)
    return llm.generate(random_prompts(6, seed=4, vocab=256), params)


def logprob_gaps(ref, got) -> list[float]:
    """|logprob difference| of every top-5 token both runs list, at every step whose context (the
    prompt and the tokens before) is still the same in both."""
    gaps = []
    for a, b in zip(ref, got, strict=True):
        for step, (la, lb) in enumerate(zip(a.logprobs, b.logprobs, strict=True)):
            gaps += [abs(la[t].logprob - lb[t].logprob) for t in set(la) & set(lb)]
            if a.token_ids[step] != b.token_ids[step]:
                break
    return gaps


def test_fp8_kv_logprobs_match_a_float_pool_of_e4m3_rounded_keys(tmp_path, monkeypatch) -> None:
    """A random Llama, greedy, float32, torch backend. The FP8 pool gives the logprobs of a
    float32 pool into which every key and value is written already rounded to E4M3 (within
    float32 noise); against the plain float32 pool the rounding shows, within 0.5."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.attention.backend import Attention

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
                                 initializer_range=0.2)).save_pretrained(tmp_path)
    fp8 = logprob_runs(tmp_path, attention_backend="torch", kv_cache_dtype="fp8")
    plain = logprob_runs(tmp_path, attention_backend="torch")
    forward = Attention.forward

    def rounded_kv(self, q, k, v, meta):
        return forward(self, q, dequantize_kv(quantize_kv(k, 1.0), 1.0, k.dtype),
                       dequantize_kv(quantize_kv(v, 1.0), 1.0, v.dtype), meta)

    monkeypatch.setattr(Attention, "forward", rounded_kv)
    rounded = logprob_runs(tmp_path, attention_backend="torch")
    same = logprob_gaps(rounded, fp8)
    assert [o.token_ids for o in fp8] == [o.token_ids for o in rounded]
    assert len(same) >= 6 * 8 * 4 and max(same) < 1e-4
    apart = logprob_gaps(plain, fp8)
    assert len(apart) >= 4 and 1e-3 < max(apart) < 0.5
