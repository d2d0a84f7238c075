"""What the CPU is, read once from /proc/cpuinfo: its flags and vendor, which pick kernels and
build keys. Torch-free, so the native builder and the host settings both build on it."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.cache
def cpuinfo_field(name: str) -> str:
    """The first CPU's ``name`` field in /proc/cpuinfo (``flags``, ``vendor_id``, ...); empty
    where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == name:
                return value.strip()
    except OSError:
        pass
    return ""


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The first CPU's flags in /proc/cpuinfo (empty where there is none)."""
    return frozenset(cpuinfo_field("flags").split())


def has_amx() -> bool:
    """Whether the CPU has AMX tiles for bfloat16: then oneDNN's bfloat16 products win at every
    size, and torch's bfloat16 attention (SDPA) beats its float32 one."""
    return "amx_bf16" in cpu_flags()


def has_avx512() -> bool:
    """Whether the C kernels (built with -march=native) get their AVX-512 instances."""
    return "avx512f" in cpu_flags()


def cpu_vendor() -> str:
    """``GenuineIntel``, ``AuthenticAMD``, ... (empty where /proc/cpuinfo has none). MKL picks
    its kernels by vendor: on AMD its float32 products ran at half oneDNN's rate (probe JSON in
    bench/published/probe-products-*)."""
    return cpuinfo_field("vendor_id")
