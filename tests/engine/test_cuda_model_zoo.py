"""The new families' GPU paths, compiled: sliding windows in the Triton attention kernels, the
fused-MoE kernels, and whole tiny models of each family on CUDA (Triton attention, CUDA graphs
for decode steps and piecewise ones for steps with prefill chunks) against HF's float32 greedy tokens.

Skipped without CUDA, and under the Triton interpreter: run alone,
``TRITON_INTERPRET=0 pytest --noconftest tests/engine/test_cuda_model_zoo.py``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "0")

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from engine_cases import hf_greedy, random_prompts  # noqa: E402
from family_models import FAMILIES, PHI_ORIGINAL_CONTEXT, build_family  # noqa: E402
from test_sliding_window_attention import make_step, windowed_reference  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402
from engine.attention.triton_backend import TritonAttentionBackend, interpreted  # noqa: E402
from engine.attention.triton_kernels import extend_kernel  # noqa: E402
from engine.models import moe, moe_triton  # noqa: E402

if interpreted(extend_kernel):
    pytest.skip("triton is interpreted in this process (TRITON_INTERPRET=1)", allow_module_level=True)


@pytest.mark.parametrize("head_dim", [64, 256])
@pytest.mark.parametrize("window", [1, 20, 32])
def test_compiled_triton_attention_honours_the_window(head_dim, window):
    meta, k_cache, v_cache, q, k, v = make_step(1, 4, head_dim, torch.float32, window, True)
    backend = TritonAttentionBackend()
    for name in ("query_start_loc", "seq_lens", "context_lens", "slot_mapping", "block_tables"):
        setattr(meta, name, getattr(meta, name).cuda())
    kc, vc = k_cache.cuda(), v_cache.cuda()
    backend.write_kv(k.cuda(), v.cuda(), kc, vc, meta)
    got = backend.attend(q.cuda(), k.cuda(), v.cuda(), kc, vc, meta, head_dim**-0.5, window).cpu()
    meta.block_tables, meta.query_start_loc = meta.block_tables.cpu(), meta.query_start_loc.cpu()
    want = windowed_reference(q, kc.cpu(), vc.cpu(), meta, head_dim**-0.5, window, canonical=True)
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_compiled_fused_moe_matches_grouped_path(dtype):
    gen = torch.Generator().manual_seed(0)
    experts, hidden, inter, tokens = 16, 256, 512, 300
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.05
    down = torch.randn(experts, hidden, inter, generator=gen) * 0.05
    x = torch.randn(tokens, hidden, generator=gen)
    weights, ids = moe.route(torch.randn(tokens, experts, generator=gen), 4, True, torch.float32)
    args = [t.to(dtype) for t in (x, gate_up, down)]
    got = moe_triton.fused_moe(*[a.cuda() for a in args], weights.to(dtype).cuda(), ids.cuda(), F.silu).cpu()
    want = moe.grouped_moe(*[a.float() for a in args], weights.to(dtype).float(), ids, F.silu)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_family_on_cuda_matches_hf(kind, tmp_path):
    model_dir = build_family(kind, tmp_path / kind, tmp_path)  # no tokenizer: the prompts are token ids
    prompts = random_prompts(9, seed=3)
    if kind == "phi3":
        prompts = [p for p in prompts if len(p) + 12 <= PHI_ORIGINAL_CONTEXT]
    refs = hf_greedy(model_dir, prompts, 12)
    llm = LLM(str(model_dir), device="cuda", num_kv_blocks=256, max_num_batched_tokens=48)
    outs = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0))
    assert [o.token_ids for o in outs] == refs
    runner = llm.engine.runner
    if runner.decode_graphs is not None:  # steps with prefill chunks replayed the piecewise graphs
        assert runner.mixed_graphs is not None and runner.mixed_graphs.steps > 0
