"""The model runner owns the device side: it sizes, allocates and binds the KV pool itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine import EngineConfig, cuda_profile, kv_cache
from engine.attention import get_backend
from engine.device_features import DEFAULT_LIMITS, DeviceFeatures
from engine.model_loader import load_model
from engine.model_runner import ModelRunner


def runner_for(tiny_model_dir, features: DeviceFeatures, **config) -> ModelRunner:
    limits = {"max_num_seqs": DEFAULT_LIMITS.max_num_seqs, "max_num_batched_tokens": DEFAULT_LIMITS.max_num_batched_tokens}
    cfg = EngineConfig(model=str(tiny_model_dir), **(limits | config))  # as LLMEngine resolves them on a CPU
    model = load_model(tiny_model_dir, torch.float32, "cpu", 128)
    return ModelRunner(model, get_backend("torch", "cpu"), cfg, 128, "cpu", features)


def test_the_runner_allocates_and_binds_the_pool(tiny_model_dir):
    runner = runner_for(tiny_model_dir, DeviceFeatures("torch", cuda_graphs=False, profile_kv_pool=False),
                        num_kv_blocks=12)
    assert runner.num_kv_blocks == 12 and runner.kv_pool.shape[2 + runner.backend.block_axis] == 12
    for i, attn in enumerate(runner.model.attention_layers()):
        assert attn.k_cache.data_ptr() == runner.kv_pool[0, i].data_ptr()
        assert attn.v_cache.data_ptr() == runner.kv_pool[1, i].data_ptr()
    # Without num_kv_blocks on a CPU, the pool is what kv_cache_memory_gb holds.
    per_block = 2 * 2 * 16 * 2 * 16 * 4  # k and v, 2 layers, 16 tokens, 2 kv heads, head_dim 16, float32
    sized = runner_for(tiny_model_dir, DeviceFeatures("torch", cuda_graphs=False, profile_kv_pool=False),
                       kv_cache_memory_gb=per_block * 40 / 2**30)
    assert sized.num_kv_blocks == 40


def test_profiling_runs_one_full_budget_step_and_lets_go_of_the_probe_pool(tiny_model_dir, monkeypatch):
    """The GPU sizing path, run on a CPU with the CUDA memory calls stubbed: the budget of 300
    tokens is split at the 128-token context into 128 + 128 + 44 (8 + 8 + 3 blocks), and the
    probe pool's bytes are taken out of the measured peak."""
    seen = {}
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 10**9)

    def blocks_from_cuda_memory(device, utilization, peak, per_block):
        seen.update(peak=peak, per_block=per_block, utilization=utilization)
        return 21

    monkeypatch.setattr(cuda_profile, "blocks_from_cuda_memory", blocks_from_cuda_memory)
    runner = runner_for(tiny_model_dir, DeviceFeatures("torch", cuda_graphs=False, profile_kv_pool=True),
                        max_num_batched_tokens=300, gpu_memory_utilization=0.5)
    per_block = 2 * 2 * 16 * 2 * 16 * 4
    assert seen == {"peak": 10**9 - 19 * per_block, "per_block": per_block, "utilization": 0.5}
    assert runner.num_kv_blocks == 21 and runner.kv_pool.shape[2 + runner.backend.block_axis] == 21
    assert runner.model.attention_layers()[0].k_cache.data_ptr() == runner.kv_pool[0, 0].data_ptr()


def _thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "none"
    return text.split("[", 1)[1].split("]", 1)[0]


def test_a_cpu_pool_is_zeroed_and_asks_for_huge_pages(monkeypatch):
    """The pool is zeroed whichever way it is allocated, and on a CPU it asks for transparent
    huge pages before its first touch, unless TOKENMILL_KV_HUGE_PAGES=0."""
    asked = []
    real = kv_cache.advise_huge_pages
    monkeypatch.setattr(kv_cache, "advise_huge_pages", lambda t: asked.append(t.data_ptr()) or real(t))
    pool = kv_cache.allocate_kv_pool(2, (3, 40, 16, 64), torch.float32, "cpu")
    assert pool.shape == (2, 2, 3, 40, 16, 64) and not pool.any()
    assert asked == [pool.data_ptr()]
    monkeypatch.setenv("TOKENMILL_KV_HUGE_PAGES", "0")
    assert not kv_cache.allocate_kv_pool(2, (3, 40, 16, 64), torch.float32, "cpu").any()
    assert len(asked) == 1


def test_huge_page_advice_needs_a_whole_aligned_huge_page():
    assert not kv_cache.advise_huge_pages(torch.empty(1 << 20, dtype=torch.uint8))  # under 2 MiB
    if _thp_mode() not in ("madvise", "always"):
        pytest.skip(f"transparent huge pages are {_thp_mode()!r} here")
    assert kv_cache.advise_huge_pages(torch.empty(8 << 20, dtype=torch.uint8))
