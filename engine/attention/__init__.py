"""Attention interface and its backends (torch for CPU, Triton for CUDA)."""

from engine.attention.backend import Attention, AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import TorchAttentionBackend
from engine.device_features import triton_available


def get_backend(name: str, device: str) -> AttentionBackend:
    """``auto``: Triton on CUDA where triton is installed (verified on an H200, see
    ``engine/device_features.py``), torch everywhere else."""
    if name == "auto":
        name = "triton" if str(device).startswith("cuda") and triton_available() else "torch"
    if name == "torch":
        return TorchAttentionBackend()
    if name == "triton":
        from engine.attention.triton_backend import TritonAttentionBackend  # lazy: triton is optional

        return TritonAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r} (auto, torch, triton)")


__all__ = ["Attention", "AttentionBackend", "AttentionMetadata", "get_backend"]
