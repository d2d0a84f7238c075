"""The unverified CUDA pieces are opt-in and announced (issue: no GPU has run them yet)."""

import warnings

import pytest

from engine.attention import get_backend
from engine.device_features import announce, choose_features


def test_cpu_runs_the_torch_backend_without_warnings() -> None:
    f = choose_features("cpu", "auto", None, None)
    assert (f.attention_backend, f.cuda_graphs, f.profile_kv_pool, f.warnings) == ("torch", False, False, ())


def test_cuda_default_is_torch_backend_eager_and_names_the_unverified_profile() -> None:
    f = choose_features("cuda", "auto", None, None)
    assert f.attention_backend == "torch" and not f.cuda_graphs and f.profile_kv_pool
    assert len(f.warnings) == 1 and "KV pool sizing" in f.warnings[0]
    assert choose_features("cuda:0", "auto", None, 512).warnings == ()


def test_triton_and_cuda_graphs_only_when_asked_for_and_then_warned() -> None:
    eager = choose_features("cuda", "triton", None, 512)
    assert eager.attention_backend == "triton" and not eager.cuda_graphs
    assert [w.split(" has never")[0] for w in eager.warnings] == ["the Triton attention backend"]
    graphs = choose_features("cuda", "triton", False, 512)
    assert graphs.cuda_graphs
    assert [w.split(" has never")[0] for w in graphs.warnings] == [
        "the Triton attention backend", "CUDA-graph decode capture"]
    assert not choose_features("cuda", "triton", True, 512).cuda_graphs
    assert not choose_features("cuda", "torch", False, 512).cuda_graphs  # graphs need the Triton backend


def test_auto_backend_is_torch_on_cuda_too() -> None:
    assert get_backend("auto", "cuda").name == "torch"


def test_announce_warns_loudly_once() -> None:
    with pytest.warns(RuntimeWarning, match="not yet verified on a GPU: the Triton attention backend"):
        announce(choose_features("cuda", "triton", None, 512))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        announce(choose_features("cpu", "auto", None, None))
