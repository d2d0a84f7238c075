"""What an engine builds for its device, and which parts of that no GPU run has verified.

On CUDA the defaults are the pieces verified on an H200 (README "The CUDA path",
bench/published/gpu-*.json): the Triton attention backend, CUDA-graph decode and KV sizing
from ``gpu_memory_utilization`` after a profiling step. What has still never run on a GPU
is named in one start-up warning when it is switched on: today ``compile=True``.
"""

from __future__ import annotations

import importlib.util
import logging
import warnings
from dataclasses import dataclass

log = logging.getLogger(__name__)

UNVERIFIED = "has never run on a GPU in this project's tests"


@dataclass(frozen=True)
class DeviceFeatures:
    """What the engine builds for one device; ``warnings`` name each unverified part in use."""

    attention_backend: str  # "torch" | "triton"
    cuda_graphs: bool
    profile_kv_pool: bool
    warnings: tuple[str, ...] = ()


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def choose_features(
    device: str, attention_backend: str, enforce_eager: bool | None, num_kv_blocks: int | None,
    compile: bool = False, head_dim: int | None = None,
) -> DeviceFeatures:
    """Pure decision from the settings (and whether triton is installed): testable without a GPU.

    CUDA: ``auto`` is the Triton backend where triton is installed (torch otherwise), CUDA graphs
    are captured unless ``enforce_eager=True`` (they need the Triton backend), and the KV pool is
    sized by a profiling step unless ``num_kv_blocks`` is set. ``auto`` falls back to the torch
    backend for a head size the Triton kernels do not take (a power of two >= 16; Phi-3-mini's
    is 96)."""
    if not device.startswith("cuda"):
        return DeviceFeatures("torch" if attention_backend == "auto" else attention_backend, False, False)
    backend = attention_backend
    if backend == "auto":
        backend = "triton" if triton_available() else "torch"
        if backend == "triton" and head_dim is not None and (head_dim < 16 or head_dim & (head_dim - 1)):
            log.info("head size %d is not one the Triton attention kernels take: the torch backend, eagerly", head_dim)
            backend = "torch"
    graphs = backend == "triton" and enforce_eager is not True
    if backend == "torch" and enforce_eager is False:
        log.info("CUDA graphs need the Triton attention backend: running eagerly")
    notes = []
    if compile:
        notes.append(f"torch.compile of the model (compile=True) {UNVERIFIED}")
    return DeviceFeatures(backend, graphs, num_kv_blocks is None, tuple(notes))


def announce(features: DeviceFeatures) -> None:
    """One loud warning at start-up, through both logging and ``warnings``."""
    if not features.warnings:
        return
    text = "tokenmill CUDA path not verified on a GPU: " + "; ".join(features.warnings)
    log.warning(text)
    warnings.warn(text, RuntimeWarning, stacklevel=3)
