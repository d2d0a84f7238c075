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


@dataclass(frozen=True)
class BatchLimits:
    """A step's bounds: sequences it runs (``max_num_seqs``) and tokens it computes
    (``max_num_batched_tokens``)."""

    max_num_seqs: int
    max_num_batched_tokens: int


DEFAULT_LIMITS = BatchLimits(256, 2048)
# The 1,024-request job on an H200 (docs/performance/host-path.md, tenth round): 53% of its floor
# with these against 42-43% with DEFAULT_LIMITS. vLLM raises its offline defaults to 1,024
# sequences on GPUs of 70 GiB or more other than the A100, where large budgets cost throughput.
LARGE_GPU_LIMITS = BatchLimits(1024, 8192)
LARGE_GPU_BYTES = 70 * 2**30


def default_batch_limits(device: str, memory_bytes: int = 0, device_name: str = "") -> BatchLimits:
    """Pure decision from what the device is: testable without a GPU."""
    large = device.startswith("cuda") and memory_bytes >= LARGE_GPU_BYTES and "a100" not in device_name.lower()
    return LARGE_GPU_LIMITS if large else DEFAULT_LIMITS


def batch_limits(device: str, max_num_seqs: int | None, max_num_batched_tokens: int | None) -> BatchLimits:
    """The bounds given, the device's default for each one left None."""
    if max_num_seqs is not None and max_num_batched_tokens is not None:
        return BatchLimits(max_num_seqs, max_num_batched_tokens)
    memory, name = 0, ""
    if device.startswith("cuda"):
        import torch

        props = torch.cuda.get_device_properties(torch.device(device))
        memory, name = props.total_memory, props.name
    default = default_batch_limits(device, memory, name)
    return BatchLimits(
        default.max_num_seqs if max_num_seqs is None else max_num_seqs,
        default.max_num_batched_tokens if max_num_batched_tokens is None else max_num_batched_tokens,
    )


def announce(features: DeviceFeatures) -> None:
    """One loud warning at start-up, through both logging and ``warnings``."""
    if not features.warnings:
        return
    text = "tokenmill CUDA path not verified on a GPU: " + "; ".join(features.warnings)
    log.warning(text)
    warnings.warn(text, RuntimeWarning, stacklevel=3)
