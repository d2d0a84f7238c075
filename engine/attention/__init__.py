"""Attention interface and its backends (torch for CPU, Triton for CUDA)."""

from engine.attention.backend import Attention, AttentionBackend
from engine.attention.metadata import AttentionMetadata


def get_backend(name: str, device: str) -> AttentionBackend:
    """``auto`` picks Triton on CUDA and torch elsewhere."""
    if name == "auto":
        name = "triton" if device.startswith("cuda") else "torch"
    if name == "torch":
        from engine.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "triton":
        from engine.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r} (auto, torch, triton)")


__all__ = ["Attention", "AttentionBackend", "AttentionMetadata", "get_backend"]
