"""Mixture-of-experts pieces against HF transformers' own modules: routing (the same experts
and weights, ties in router scores included), the grouped CPU path, and the Triton fused-MoE
kernels (under the interpreter on CPU)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton's first import (see test_triton_kernels.py)

import pytest
import torch
import torch.nn.functional as F

from engine.models import moe

E, H, INTER, K = 8, 64, 32, 2


def _configs():
    import transformers

    small = dict(hidden_size=H, num_attention_heads=4, num_key_value_heads=2, vocab_size=100)
    return {
        "qwen3-moe": (transformers.Qwen3MoeConfig(**small, num_experts=E, num_experts_per_tok=K,
                                                  moe_intermediate_size=INTER, norm_topk_prob=True), True),
        "qwen3-moe-unnormalised": (transformers.Qwen3MoeConfig(**small, num_experts=E, num_experts_per_tok=K,
                                                               moe_intermediate_size=INTER, norm_topk_prob=False),
                                   True),
        "mixtral": (transformers.MixtralConfig(**small, intermediate_size=INTER, num_local_experts=E,
                                               num_experts_per_tok=K), False),
    }


@pytest.mark.parametrize("kind", ["qwen3-moe", "qwen3-moe-unnormalised", "mixtral"])
def test_routing_matches_hf_including_ties(kind):
    """Experts 2, 5 and 6 have identical router rows, so every token's scores for them tie
    exactly; experts chosen and their weights must still be HF's."""
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    config, cast = _configs()[kind]
    router = (MixtralTopKRouter if kind == "mixtral" else Qwen3MoeTopKRouter)(config)
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(E, H, generator=gen)
    weight[5] = weight[6] = weight[2]
    with torch.no_grad():
        router.weight.copy_(weight)
    x = torch.randn(40, H, generator=gen)
    x[:10] = 0.0  # all eight scores tie
    _, hf_weights, hf_ids = router(x)
    ours = moe.SparseMoE(H, INTER, E, K, kind != "qwen3-moe-unnormalised", ("a", "b", "c"), cast_weights=cast)
    ours.gate.weight.data.copy_(weight)
    weights, ids = moe.route(F.linear(x, ours.gate.weight), K, ours.normalize, x.dtype if cast else None)
    assert torch.equal(ids, hf_ids)
    assert torch.equal(weights, hf_weights)
    assert any({2, 5, 6} & set(row) for row in ids[10:].tolist())  # the tied experts do get chosen


def _experts(seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(E, 2 * INTER, H, generator=gen) * 0.2
    down = torch.randn(E, H, INTER, generator=gen) * 0.2
    x = torch.randn(37, H, generator=gen)
    logits = torch.randn(37, E, generator=gen)
    logits[:, 7] = -100.0  # expert 7 is never chosen
    weights, ids = moe.route(logits, K, True, torch.float32)
    return x, gate_up, down, weights, ids


def test_grouped_path_equals_hf_experts_and_reads_each_expert_once(monkeypatch):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config, _ = _configs()["qwen3-moe"]
    x, gate_up, down, weights, ids = _experts()
    hf = Qwen3MoeExperts(config)
    with torch.no_grad():
        hf.gate_up_proj.copy_(gate_up)
        hf.down_proj.copy_(down)
        want = hf(x, ids, weights)
    products = []
    linear = F.linear
    monkeypatch.setattr(F, "linear", lambda a, w, b=None: products.append(w.shape) or linear(a, w, b))
    got = moe.grouped_moe(x, gate_up, down, weights, ids, F.silu)
    assert torch.equal(got, want)
    assert len(products) == 2 * len(set(ids.flatten().tolist())) == 2 * 7  # one gate/up and one down per expert hit


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_triton_fused_moe_matches_grouped_path(dtype):
    pytest.importorskip("triton", reason="triton is not installed")
    from engine.models import moe_triton

    if not moe_triton.interpreted():
        pytest.skip("triton was imported before TRITON_INTERPRET=1 (run with tests/conftest.py)")
    x, gate_up, down, weights, ids = _experts()
    x, gate_up, down = x.to(dtype), gate_up.to(dtype), down.to(dtype)
    got = moe_triton.fused_moe(x, gate_up, down, weights.to(dtype), ids, F.silu)
    want = moe.grouped_moe(x.float(), gate_up.float(), down.float(), weights.to(dtype).float(), ids, F.silu)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)
