"""Piecewise graphs for steps with prefill chunks (engine/mixed_graphs.py), without a GPU.

``capture=False`` runs the layers eagerly but through everything else a replay does: the static
input buffers padded to a captured size, q/k/v copied into the shared static buffers at each
attention cut, attention over the real rows only with the step's own metadata, the output
buffer read back by the next layer, and the LM head on the sampling rows. The captured path
itself is checked on a GPU by tests/engine/test_triton_cuda.py.
"""

from __future__ import annotations

import pytest
from family_models import build_family

from engine import LLMEngine, SamplingParams
from engine.config import EngineConfig
from engine.mixed_graphs import MixedGraphs

PROMPTS = [[5, 6, 7], [9] * 40, [11, 12], list(range(100, 130))]


def run(model_dir, piecewise: bool, token_budget: int, sizes=(8, 16, 24, 32)) -> tuple[list[list[int]], object]:
    engine = LLMEngine(EngineConfig(model=str(model_dir), attention_backend="torch", device="cpu", num_kv_blocks=64,
                                    max_model_len=256, max_num_seqs=4, max_num_batched_tokens=token_budget))
    graphs = None
    if piecewise:
        graphs = MixedGraphs(engine.runner.model, engine.runner.backend, max(sizes), "cpu", capture=False,
                             token_sizes=sizes)
        engine.runner.mixed_graphs = graphs
    for i, p in enumerate(PROMPTS):
        engine.add_request(str(i), p, SamplingParams(max_tokens=5 + 2 * i, temperature=0, ignore_eos=True))
    outs = {}
    while engine.has_unfinished():
        outs.update({o.request_id: o.token_ids for o in engine.step()})
    return [outs[str(i)] for i in range(len(PROMPTS))], graphs


@pytest.mark.parametrize("token_budget", [20, 64])
def test_piecewise_steps_give_the_eager_tokens(tiny_model_dir, token_budget):
    """Budget 20: prefill chunks beside decodes in most steps, every size padded; budget 64:
    the first step (75 prompt tokens) is over the largest size (32) and runs eagerly."""
    got, graphs = run(tiny_model_dir, True, token_budget)
    assert got == run(tiny_model_dir, False, token_budget)[0]
    assert graphs.steps >= 8 and graphs.padded_tokens > 0
    assert set(graphs._buffers) and all(b.out.shape[0] == 32 for b in graphs._buffers.values())


@pytest.mark.parametrize("kind", ["gemma3", "qwen3-moe"])
def test_piecewise_steps_keep_windows_and_experts(tmp_path, default_model_dir, kind):
    """Sliding-window layers (each cut keeps its layer's window) and MoE layers behind the cuts."""
    model_dir = build_family(kind, tmp_path / kind, default_model_dir)
    got, graphs = run(model_dir, True, 20)
    assert got == run(model_dir, False, 20)[0]
    assert graphs.steps >= 8


def test_a_token_budget_over_every_size_still_captures_one(tiny_model_dir):
    """The largest size is the budget itself when the budget is under the default sizes' top."""
    from engine.attention.torch_backend import TorchAttentionBackend

    graphs = MixedGraphs(None, TorchAttentionBackend(), 100, "cpu", capture=False, token_sizes=(16, 64, 128))
    assert graphs.sizes == [16, 64, 100] and graphs.max_tokens == 100
