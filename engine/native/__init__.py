"""Builds and loads the small C libraries of the CPU path (once, cached), called through ctypes.

Each library is compiled with the system C compiler and ``-march=native``, and cached under
``$TOKENMILL_CACHE/kernels`` keyed by its sources, the flags and the CPU's feature flags.

Why ``-fopenmp`` is safe here: torch ships its own ``libgomp.so.1`` and loads it first. The
dynamic loader matches an already-loaded library by its soname, so a library built with
``-fopenmp`` (needing ``libgomp.so.1``) binds to torch's copy: its parallel loops run on
torch's OpenMP threads instead of a second pool that would spin against them on the same
cores. ``tests/test_native.py`` checks that only one libgomp is mapped.

Without a compiler, or with ``TOKENMILL_CPU_KERNELS=0``, ``load()`` returns None and callers
use their torch formulation.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch  # loads torch's libgomp before any library here needs it

from engine.cpu_info import cpuinfo_field
from engine.model_registry import cache_dir

log = logging.getLogger(__name__)

FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-std=gnu11", "-shared", "-fPIC"]


def cpu_flags() -> str:
    """The CPU's flags as one string, for the build cache key (-march=native depends on them)."""
    return cpuinfo_field("flags")


def _build(compiler: str, source: Path, flags: list[str], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        result = subprocess.run([compiler, *flags, str(source), "-o", str(built), "-lm"],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[-2000:]}")
        built.rename(target)  # atomic: a concurrent builder never loads a half-written file


def load(name: str, source: Path, includes: tuple[Path, ...] = (), flags: list[str] | None = None) -> ctypes.CDLL | None:
    """The built library ``name`` from ``source`` (``includes``: files it #includes, part of the
    cache key), or None with one warning where it cannot be had."""
    if os.environ.get("TOKENMILL_CPU_KERNELS", "1") == "0":
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler found: %s falls back to torch ops (slower)", name)
        return None

    flags = FLAGS if flags is None else flags
    text = b"".join(p.read_bytes() for p in (source, *includes))
    key = hashlib.sha256(text + " ".join(flags).encode() + cpu_flags().encode()).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"{name}-{key}.so"
    try:
        if not target.is_file():
            _build(compiler, source, flags, target)
        return ctypes.CDLL(str(target))
    except (OSError, RuntimeError) as exc:
        log.warning("cannot build %s, falling back to torch ops: %s", name, exc)
        return None


FUSED_SOURCE = Path(__file__).with_name("fused_ops.c")
FUSED_BODY = FUSED_SOURCE.with_name("fused_ops_body.h")
BF16_HEADER = FUSED_SOURCE.with_name("bf16.h")  # the bfloat16 conversions every C kernel includes
AVX512_MATH_HEADER = FUSED_SOURCE.with_name("avx512_math.h")  # vector exp and batched sum of the AVX-512 kernels
AVX2_MATH_HEADER = FUSED_SOURCE.with_name("avx2_math.h")  # the vector exp of the AVX2 builds
FAST_EXP_HEADER = FUSED_SOURCE.with_name("fast_exp.h")  # the exp arithmetic both math headers expand
FUSED_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}


@functools.cache
def fused_ops() -> ctypes.CDLL | None:
    """``fused_ops.c``: residual add + RMSNorm, rotary in place, KV write (float32 and bfloat16)."""
    lib = load("fused_ops", FUSED_SOURCE, (FUSED_BODY, BF16_HEADER))
    if lib is None:
        return None
    p, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    for sfx in FUSED_SUFFIX.values():
        getattr(lib, f"rms_norm_{sfx}").argtypes = [p, p, p, i64, i64, f32, i64]
        getattr(lib, f"add_rms_norm_{sfx}").argtypes = [p, p, p, p, i64, i64, f32, i64]
        getattr(lib, f"rotary_{sfx}").argtypes = [p, p, p, p, i64, i64, i64, i64, i64]
        fn = getattr(lib, f"write_kv_{sfx}")
        fn.argtypes = [p, p, i64, p, p, p, i64, i64, i64, i64, i64]
        fn.restype = ctypes.c_int
    return lib


def fused_fn(name: str, *tensors: torch.Tensor):
    """The ``fused_ops`` kernel ``name`` for these CPU tensors of one dtype, or None where the
    caller's torch formulation must run."""
    t = tensors[0]
    dtype = t.dtype
    if not t.is_cpu or dtype not in FUSED_SUFFIX:
        return None
    for x in tensors:  # a plain loop: this runs several times per layer and step
        if x.dtype != dtype:
            return None
    return _fused_kernel(name, dtype)


@functools.cache
def _fused_kernel(name: str, dtype: torch.dtype):
    """One lookup per kernel and dtype (each layer asks several times a step)."""
    lib = fused_ops()
    return None if lib is None else getattr(lib, f"{name}_{FUSED_SUFFIX[dtype]}")


def threads() -> int:
    return max(1, torch.get_num_threads())


FEW_ROWS_SOURCE = Path(__file__).with_name("few_rows.c")


@functools.cache
def few_rows() -> ctypes.CDLL | None:
    """``few_rows.c``: products of 1-8 rows with a weight read in place (AVX-512; float32 with AVX2 too)."""
    # contraction into FMAs left on: the sums need not match torch's rounding
    lib = load("few_rows", FEW_ROWS_SOURCE, (AVX512_MATH_HEADER, AVX2_MATH_HEADER, FAST_EXP_HEADER),
               [f for f in FLAGS if f != "-ffp-contract=off"])
    if lib is None:
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    for name in ("few_rows_f32", "few_rows_bf16"):
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.argtypes = [p, i64, p, p, i64, i64, i64, i64, i64]
            fn.restype = ctypes.c_int
    return lib


THREADS_SOURCE = Path(__file__).with_name("threads.c")


@functools.cache
def thread_lib() -> ctypes.CDLL | None:
    lib = load("threads", THREADS_SOURCE)
    if lib is not None:
        lib.bind_threads.argtypes = [ctypes.c_void_p, ctypes.c_int64]
        lib.bind_threads.restype = ctypes.c_int
    return lib
