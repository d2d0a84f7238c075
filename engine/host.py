"""Process-wide settings for running the engine on a CPU host."""

from __future__ import annotations

import ctypes
import logging
import os

import torch

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_for_cpu(num_threads: int | None) -> None:
    """One intra-op thread per usable core, and a malloc that keeps its memory.

    glibc serves allocations above 128 KiB with a fresh mmap and returns them on free, so
    every step's activations arrive as zero-filled pages: measured here, 420k page faults and
    10% of a 32-request run. Raising the mmap and trim thresholds (as tcmalloc would, which
    vLLM's CPU guide preloads) lets freed blocks be reused. A no-op outside glibc.
    """
    torch.set_num_threads(num_threads or len(os.sched_getaffinity(0)))
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # glibc's maximum
        libc.mallopt(_M_TRIM_THRESHOLD, 512 << 20)
    except (OSError, AttributeError) as exc:
        log.debug("mallopt not available: %s", exc)
