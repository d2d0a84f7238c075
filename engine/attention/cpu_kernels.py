"""The CPU decode-attention kernel (``cpu_paged_decode.c``), built once with the system C
compiler and called through ctypes.

Why C: written with torch ops, paged decode attention either gathers every context into a
copy or leaves ``torch.compile`` to fuse a per-token index into the dot products; measured
here, both run 6-8 times slower than reading the KV once, and decode attention was 30% of
a batch job's time. The kernel reads each block in place through the block table.

Why ctypes and Python threads: ctypes releases the GIL during the call, so splitting the
(sequence, KV head) items across ``torch.get_num_threads()`` threads runs them in
parallel without a second OpenMP runtime beside torch's.

The library is cached under ``$TOKENMILL_CACHE/kernels`` keyed by the source, the flags and
the CPU's feature flags (it is built with ``-march=native``). Without a compiler, or with
``TOKENMILL_CPU_KERNELS=0``, ``load()`` returns None and the torch path is used.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_paged_decode.c")
BODY = SOURCE.with_name("cpu_paged_decode_body.h")  # included twice by SOURCE (float32, bfloat16 KV)
FLAGS = ["-O3", "-march=native", "-fopenmp-simd", "-std=gnu11", "-shared", "-fPIC"]


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        result = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(built), "-lm"],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[-2000:]}")
        built.rename(target)  # atomic: a concurrent builder never loads a half-written file


@functools.cache
def load() -> ctypes.CDLL | None:
    """The built kernel library, or None (with one warning) where it cannot be had."""
    if os.environ.get("TOKENMILL_CPU_KERNELS", "1") == "0":
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler found: CPU decode attention falls back to torch ops (slower)")
        return None
    from engine.model_registry import cache_dir

    sources = SOURCE.read_bytes() + BODY.read_bytes()
    key = hashlib.sha256(sources + " ".join(FLAGS).encode() + _cpu_flags().encode()).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"paged_decode-{key}.so"
    try:
        if not target.is_file():
            _build(compiler, target)
        lib = ctypes.CDLL(str(target))
    except (OSError, RuntimeError) as exc:
        log.warning("cannot build the CPU decode kernel, falling back to torch ops: %s", exc)
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    for fn in (lib.paged_decode_f32, lib.paged_decode_bf16):
        fn.argtypes = [p, p, p, p, i64, p, p, i64, i64, i64, i64, i64, ctypes.c_float, i64, i64]
        fn.restype = ctypes.c_int
    return lib


class PagedDecodeKernel:
    """``kernel(q, k_cache, v_cache, tables, seq_lens, seq_lens_host, scale) -> out``."""

    KV_DTYPES = (torch.float32, torch.bfloat16)

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.fns = {torch.float32: lib.paged_decode_f32, torch.bfloat16: lib.paged_decode_bf16}
        self._pool: ThreadPoolExecutor | None = None

    def _executor(self, threads: int) -> ThreadPoolExecutor:
        if self._pool is None or self._pool._max_workers < threads:
            self._pool = ThreadPoolExecutor(threads, thread_name_prefix="tokenmill-attn")
        return self._pool

    @staticmethod
    def split(costs: list[int], parts: int) -> list[tuple[int, int]]:
        """Contiguous item ranges of about equal total cost, one per thread."""
        total = sum(costs) or 1
        bounds, acc, start = [], 0, 0
        for i, c in enumerate(costs):
            acc += c
            if acc * parts >= total * (len(bounds) + 1) and len(bounds) < parts - 1:
                bounds.append((start, i + 1))
                start = i + 1
        bounds.append((start, len(costs)))
        return [b for b in bounds if b[0] < b[1]]

    @staticmethod
    def _bad_table(seq: int, tables: torch.Tensor, lens: list[int], block_size: int, num_blocks: int) -> IndexError:
        """The error for a sequence whose block table points outside the pool (the kernel refused it)."""
        used = tables[seq, : -(-lens[seq] // block_size)].tolist()
        bad = [b for b in used if not 0 <= b < num_blocks]
        return IndexError(f"decode attention: block table of sequence {seq} holds block id {bad[0]} "
                          f"outside the KV pool of {num_blocks} blocks")

    def __call__(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
        seq_lens: torch.Tensor, seq_lens_host: list[int], scale: float,
    ) -> torch.Tensor:
        n, num_heads, head_dim = q.shape
        num_kv_heads, num_blocks, block_size, _ = k_cache.shape
        assert k_cache.dtype == v_cache.dtype and k_cache.dtype in self.KV_DTYPES
        assert k_cache.is_contiguous() and v_cache.is_contiguous()
        fn = self.fns[k_cache.dtype]
        q32 = q.to(torch.float32).contiguous()
        tables = tables.to(torch.int32)
        if tables.stride(-1) != 1:
            tables = tables.contiguous()
        seq_lens = seq_lens.to(torch.int32).contiguous()
        out = torch.empty_like(q32)
        args = (q32.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), tables.stride(0),
                seq_lens.data_ptr(), out.data_ptr(), num_heads, num_kv_heads, num_blocks, block_size, head_dim,
                scale)
        costs = [length for length in seq_lens_host for _ in range(num_kv_heads)]
        ranges = self.split(costs, max(1, torch.get_num_threads()))
        # The calling thread takes the first range itself: one handoff fewer per layer.
        others = [self._executor(len(ranges) - 1).submit(fn, *args, *r) for r in ranges[1:]]
        codes = [fn(*args, *ranges[0])] + [f.result() for f in others]
        if any(c < 0 for c in codes):
            raise MemoryError("CPU decode kernel could not allocate its score buffer")
        if any(codes):
            raise self._bad_table(min(c for c in codes if c > 0) - 1, tables, seq_lens_host, block_size, num_blocks)
        return out.to(q.dtype)
