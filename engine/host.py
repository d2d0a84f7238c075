"""Process-wide settings of the process that runs the engine (threads and malloc on a CPU host,
the garbage collector on any)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import threading
from collections.abc import Iterator

import torch

from engine import native

log = logging.getLogger(__name__)


_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_for_cpu(num_threads: int | None, bind: bool | None = None) -> None:
    """One intra-op thread per usable core, and a malloc that keeps its memory.

    glibc serves allocations above 128 KiB with a fresh mmap and returns them on free, so
    every step's activations arrive as zero-filled pages: measured here, 420k page faults and
    10% of a 32-request run. Raising the mmap and trim thresholds (as tcmalloc would, which
    vLLM's CPU guide preloads) lets freed blocks be reused. A no-op outside glibc.

    ``bind`` (default: ``TOKENMILL_BIND_THREADS``, off unless set to 1) pins torch's OpenMP
    threads one per core (``bind_threads_to_cores``).
    """
    threads = num_threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # glibc's maximum
        libc.mallopt(_M_TRIM_THRESHOLD, 512 << 20)
    except (OSError, AttributeError) as exc:
        log.debug("mallopt not available: %s", exc)
    if bind is None:
        bind = os.environ.get("TOKENMILL_BIND_THREADS", "0") == "1"
    if bind:
        bind_threads_to_cores(threads)


def bind_threads_to_cores(threads: int) -> bool:
    """Pin OpenMP thread ``i`` of torch's team (the calling thread is thread 0) to the ``i``-th
    core this process may use, as vLLM's CPU backend does. Threads created later by the calling
    thread inherit its single core. Returns False (and changes nothing) where there are fewer
    cores than threads or the library cannot be built."""
    cpus = sorted(os.sched_getaffinity(0))
    lib = native.thread_lib()
    if lib is None or threads > len(cpus) or threads < 1:
        return False
    ids = (ctypes.c_int32 * threads)(*cpus[:threads])
    err = lib.bind_threads(ids, threads)
    if err:
        log.warning("binding threads to cores failed: %s", os.strerror(err))
        return False
    return True


def freeze_startup_objects() -> None:
    """Move every object alive now (torch, transformers, the model, the tokenizer: hundreds of
    thousands) out of the cyclic collector's reach, as vLLM does once its engine is loaded.
    Otherwise each full collection, triggered by the allocations of ordinary steps, walks all of
    them: at 1,024 sequences with prompts arriving it made a step's host work several times
    longer (docs/performance/host-path.md). Reference counting still frees what it frees; a
    process that replaces its engine calls ``release_frozen_objects`` first, or the old engine's
    cycles would never be collected."""
    global _startup_frozen
    with _freeze_lock:
        gc.freeze()  # no collection first: the engine cache collects just before it builds, and one
        # full collection per build is enough (the warm-up's garbage, about 100 objects, is kept)
        _startup_frozen = True


def release_frozen_objects() -> None:
    """Undo ``freeze_startup_objects`` and collect, so a dropped engine's memory comes back."""
    global _startup_frozen
    with _freeze_lock:
        gc.unfreeze()
        _startup_frozen = False
    gc.collect()


_freeze_lock = threading.Lock()
_startup_frozen = False  # freeze_startup_objects holds the heap: calls leave it as it is
_calls_frozen = 0  # calls inside objects_frozen_during_call now (threads may overlap)


@contextlib.contextmanager
def objects_frozen_during_call() -> Iterator[None]:
    """Keep the objects alive at the start of a call (an ``LLM.generate``) out of the cyclic
    collector's reach until it returns, and give them back after.

    The offline API has no worker to freeze its heap once (``freeze_startup_objects``), so a
    full collection that the requests' allocations trigger walks torch, transformers and the
    model: about 220 ms on this project's CPUs, once every two or three 1,024-prompt calls, with
    the device idle (docs/performance/host-path.md). Freezing and unfreezing only move list
    heads (no walk), and garbage made before the call is collected after it. Nothing happens
    where a worker already froze its heap; overlapping calls unfreeze when the last one ends."""
    global _calls_frozen
    with _freeze_lock:
        _calls_frozen += 1
        if _calls_frozen == 1 and not _startup_frozen:
            gc.freeze()
    try:
        yield
    finally:
        with _freeze_lock:
            _calls_frozen -= 1
            if _calls_frozen == 0 and not _startup_frozen:
                gc.unfreeze()
