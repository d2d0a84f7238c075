"""What runs on each device by default: on CUDA the pieces verified on a GPU (README "The CUDA
path"); only what has still never run on a GPU is announced."""

import warnings
from types import SimpleNamespace

import pytest

from engine import EngineConfig
from engine.attention import get_backend
from engine.device_features import (
    DEFAULT_LIMITS,
    LARGE_GPU_LIMITS,
    BatchLimits,
    announce,
    batch_limits,
    choose_features,
    default_batch_limits,
    triton_available,
)
from engine.llm_engine import LLMEngine


def test_cpu_runs_the_torch_backend_without_warnings() -> None:
    f = choose_features("cpu", "auto", None, None)
    assert (f.attention_backend, f.cuda_graphs, f.profile_kv_pool, f.warnings) == ("torch", False, False, ())


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_cuda_default_is_triton_with_graphs_and_profiled_pool_without_warnings() -> None:
    f = choose_features("cuda", "auto", None, None)
    assert (f.attention_backend, f.cuda_graphs, f.profile_kv_pool, f.warnings) == ("triton", True, True, ())
    assert not choose_features("cuda:0", "auto", None, 512).profile_kv_pool
    assert get_backend("auto", "cuda").name == "triton"


def test_cuda_without_triton_falls_back_to_the_torch_backend(monkeypatch) -> None:
    monkeypatch.setattr("engine.device_features.triton_available", lambda: False)
    f = choose_features("cuda", "auto", None, None)
    assert f.attention_backend == "torch" and not f.cuda_graphs


def test_eager_and_torch_backend_turn_graphs_off() -> None:
    assert not choose_features("cuda", "triton", True, 512).cuda_graphs
    assert choose_features("cuda", "triton", False, 512).cuda_graphs
    assert not choose_features("cuda", "torch", None, 512).cuda_graphs  # graphs need the Triton backend
    assert not choose_features("cuda", "torch", False, 512).cuda_graphs


def test_auto_backend_is_torch_on_cpu() -> None:
    assert get_backend("auto", "cpu").name == "torch"


def test_only_the_still_unverified_compile_is_announced() -> None:
    f = choose_features("cuda", "triton", None, None, compile=True)
    assert [w.split(" has never")[0] for w in f.warnings] == ["torch.compile of the model (compile=True)"]
    assert choose_features("cpu", "auto", None, None, compile=True).warnings == ()
    with pytest.warns(RuntimeWarning, match="not verified on a GPU: torch.compile"):
        announce(f)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        announce(choose_features("cuda", "auto", None, None))


def test_a_head_size_the_triton_kernels_do_not_take_runs_on_the_torch_backend(monkeypatch) -> None:
    """Phi-3-mini's 96-wide heads: ``auto`` takes the torch backend (eager), not an error at the
    first step; Phi-4-mini's 128 keeps Triton and graphs; an explicit ``triton`` is left as asked."""
    monkeypatch.setattr("engine.device_features.triton_available", lambda: True)
    phi3_mini = choose_features("cuda", "auto", None, None, head_dim=96)
    assert (phi3_mini.attention_backend, phi3_mini.cuda_graphs) == ("torch", False)
    phi4_mini = choose_features("cuda", "auto", None, None, head_dim=128)
    assert (phi4_mini.attention_backend, phi4_mini.cuda_graphs) == ("triton", True)
    assert choose_features("cuda", "triton", None, None, head_dim=96).attention_backend == "triton"


GIB = 2**30


def test_step_bounds_grow_on_gpus_of_70_gib_or_more_except_the_a100() -> None:
    """vLLM's rule for its offline defaults; the figures are this project's H200 measurement."""
    assert default_batch_limits("cuda", 141 * GIB, "NVIDIA H200") == BatchLimits(1024, 8192) == LARGE_GPU_LIMITS
    assert default_batch_limits("cuda:0", 70 * GIB, "NVIDIA H100 80GB HBM3") == LARGE_GPU_LIMITS
    assert default_batch_limits("cuda", 70 * GIB - 1, "NVIDIA H100") == BatchLimits(256, 2048) == DEFAULT_LIMITS
    assert default_batch_limits("cuda", 80 * GIB, "NVIDIA A100-SXM4-80GB") == DEFAULT_LIMITS
    assert default_batch_limits("cuda", 24 * GIB, "NVIDIA L4") == DEFAULT_LIMITS
    assert default_batch_limits("cpu", 1024 * GIB) == DEFAULT_LIMITS


def test_bounds_left_unset_take_the_devices_default_and_given_ones_stay(monkeypatch) -> None:
    props = SimpleNamespace(total_memory=141 * GIB, name="NVIDIA H200")
    asked = []
    monkeypatch.setattr("torch.cuda.get_device_properties", lambda dev: asked.append(str(dev)) or props)
    assert batch_limits("cuda:0", None, None) == LARGE_GPU_LIMITS and asked == ["cuda:0"]
    assert batch_limits("cuda", 64, None) == BatchLimits(64, 8192)
    assert batch_limits("cuda", None, 2048) == BatchLimits(1024, 2048)
    asked.clear()
    assert batch_limits("cuda", 8, 512) == BatchLimits(8, 512) and asked == []  # nothing to ask the device
    assert batch_limits("cpu", None, None) == DEFAULT_LIMITS and asked == []


def test_the_engine_runs_with_the_bounds_it_resolved(tiny_model_dir) -> None:
    given = EngineConfig(model=str(tiny_model_dir), device="cpu", num_kv_blocks=64, max_num_batched_tokens=512)
    engine = LLMEngine(given)
    assert (engine.config.max_num_seqs, engine.config.max_num_batched_tokens) == (256, 512)
    assert (engine.scheduler.max_num_seqs, engine.scheduler.max_num_batched_tokens) == (256, 512)
    assert engine.runner.table_rows.table.shape[0] == 256
    assert given.max_num_seqs is None  # the caller's settings are not rewritten
