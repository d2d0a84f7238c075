"""Which unverified CUDA features an engine turns on: opt-in until a GPU run has checked them.

The Triton kernels, CUDA-graph decode and the KV-sizing profile have only ever run under the
Triton interpreter on a CPU. A user's first GPU run should not meet them by default, so on CUDA
``attention_backend="auto"`` picks the torch backend (plain torch ops, the same code the CPU
path runs), CUDA graphs need ``attention_backend="triton"`` and ``enforce_eager=False`` both set
explicitly, and every unverified piece that does run is named in one loud start-up warning.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

log = logging.getLogger(__name__)

UNVERIFIED = "has never run on a GPU in this project's tests (only under TRITON_INTERPRET=1 on a CPU)"


@dataclass(frozen=True)
class DeviceFeatures:
    """What the engine builds for one device; ``warnings`` name each unverified part in use."""

    attention_backend: str  # "torch" | "triton"
    cuda_graphs: bool
    profile_kv_pool: bool
    warnings: tuple[str, ...] = ()


def choose_features(
    device: str, attention_backend: str, enforce_eager: bool | None, num_kv_blocks: int | None
) -> DeviceFeatures:
    """Pure decision from the settings: testable without a GPU."""
    backend = "torch" if attention_backend == "auto" else attention_backend
    if not device.startswith("cuda"):
        return DeviceFeatures(backend, cuda_graphs=False, profile_kv_pool=False)
    graphs = backend == "triton" and enforce_eager is False
    profile = num_kv_blocks is None
    notes = []
    if backend == "triton":
        notes.append(f"the Triton attention backend {UNVERIFIED}")
    if graphs:
        notes.append(f"CUDA-graph decode capture {UNVERIFIED}")
    elif backend == "triton" and enforce_eager is None:
        log.info("CUDA graphs are opt-in until verified on a GPU: pass enforce_eager=False to capture them")
    if profile:
        notes.append(f"KV pool sizing from gpu_memory_utilization {UNVERIFIED}; set num_kv_blocks to skip it")
    return DeviceFeatures(backend, graphs, profile, tuple(notes))


def announce(features: DeviceFeatures) -> None:
    """One loud warning at start-up, through both logging and ``warnings``."""
    if not features.warnings:
        return
    text = "tokenmill CUDA path not yet verified on a GPU: " + "; ".join(features.warnings)
    log.warning(text)
    warnings.warn(text, RuntimeWarning, stacklevel=3)
