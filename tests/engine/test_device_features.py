"""What runs on each device by default: on CUDA the pieces verified on a GPU (README "The CUDA
path"); only what has still never run on a GPU is announced."""

import warnings

import pytest

from engine.attention import get_backend
from engine.device_features import announce, choose_features, triton_available


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
