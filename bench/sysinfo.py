"""What every benchmark table names: the CPU, the flags that decide the kernels, threads, load;
and the same-run hardware ceilings the engine is measured against."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_info() -> dict:
    model, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return {"cpu": model, "flags": {f: f in flags for f in FLAGS}, "cores": len(os.sched_getaffinity(0)),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads()}


def describe(info: dict) -> str:
    flags = " ".join(f"{f}={'yes' if v else 'no'}" for f, v in info["flags"].items())
    return f"CPU: {info['cpu']} ({info['cores']} cores; {flags}); torch {info['torch']}, {info['torch_threads']} threads"


def matmul_gflops(dtype: torch.dtype, rows: int = 256, k: int = 576, n: int = 1536, seconds: float = 1.0,
                  packed: bool = False) -> float:
    """GFLOP/s of a plain ``(rows x k) @ (k x n)`` matmul (the MLP's shape), best of a few rounds.

    ``packed``: the same product with the weight prepacked for oneDNN, as the engine runs it.
    On AMD, torch's plain float32 matmul (MKL) runs at about half oneDNN's packed rate, so the
    bench takes the faster of the two as the ceiling."""
    a, b = torch.randn(rows, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    if packed:
        w = torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous(), batch_size=64)

        def product():
            return torch.ops.mkldnn._linear_pointwise(a, w, None, "none", [], "")
    else:
        def product():
            return a @ b
    for _ in range(5):
        product()
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        for _ in range(10):
            product()
        best = max(best, 2 * rows * k * n * 10 / (time.perf_counter() - t) / 1e9)
    return best


def bandwidth_gbs(mbytes: int = 512, rounds: int = 5) -> float:
    """Read+write bandwidth of a large copy (GB/s counting bytes read and written)."""
    src = torch.ones(mbytes << 18)  # float32: 4 bytes per element
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = 0.0
    for _ in range(rounds):
        t = time.perf_counter()
        dst.copy_(src)
        best = max(best, 2 * src.numel() * 4 / (time.perf_counter() - t) / 1e9)
    return best


def write_result(out_dir: str | Path, stem: str, result: dict) -> Path:
    """``result`` as ``out_dir/stem-YYYYmmdd-HHMMSS.json`` (the folder made if need be); prints
    and returns the path. Every bench script publishes its JSON this way."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return path


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def runnable() -> int:
    """Runnable tasks right now (the 4th field of /proc/loadavg, this process included)."""
    try:
        return int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return 0


def wait_for_idle(max_s: float = 120.0, quiet_samples: int = 10) -> float:
    """Wait until others' jobs have drained (at most one runnable task besides us for
    ``quiet_samples`` half-second samples in a row), at most ``max_s``; returns seconds waited."""
    start, calm = time.time(), 0
    while calm < quiet_samples and time.time() - start < max_s:
        calm = calm + 1 if runnable() <= 2 else 0
        time.sleep(0.5)
    return time.time() - start
