"""Attention interface and its backends (torch for CPU, Triton for CUDA)."""

from engine.attention.backend import Attention, AttentionBackend
from engine.attention.metadata import AttentionMetadata


def get_backend(name: str, device: str) -> AttentionBackend:
    """``auto`` is torch everywhere until the Triton path is verified on a GPU
    (``engine/device_features.py``); ask for ``triton`` by name."""
    if name == "auto":
        name = "torch"
    if name == "torch":
        from engine.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "triton":
        from engine.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r} (auto, torch, triton)")


__all__ = ["Attention", "AttentionBackend", "AttentionMetadata", "get_backend"]
