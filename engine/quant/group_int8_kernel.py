"""The few-row C product of group-wise int8 weights (``engine/native/group_int8_rows.c``) as
``GroupInt8Linear`` calls it: GGUF Q8_0 / Q5_0 values and float16 scales read as stored and
dequantised in registers, for up to ``MAX_ROWS`` rows of float32 or bfloat16."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from engine import native

SOURCE = Path(native.__file__).with_name("group_int8_rows.c")
INCLUDES = (native.BF16_HEADER, SOURCE.with_name("bf16_store.h"), native.AVX512_MATH_HEADER, native.AVX2_MATH_HEADER,
            native.FAST_EXP_HEADER)
SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
MAX_ROWS = 8
GROUP = 32


def build(march: str | None = None) -> ctypes.CDLL | None:
    """The library for this CPU, or for ``march`` (tests: ``haswell``); None where it cannot be
    had or the CPU has neither AVX-512 BW nor AVX2 with FMA."""
    flags = [f for f in native.FLAGS if f != "-ffp-contract=off"]  # FMAs: the sums need not match torch's order
    if march is not None:
        flags = [f"-march={march}" if f == "-march=native" else f for f in flags]
    lib = native.load("group_int8_rows" + ("" if march is None else f"-{march}"), SOURCE, INCLUDES, flags)
    if lib is None or not hasattr(lib, "group_int8_f32"):
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    for sfx in SUFFIX.values():
        fn = getattr(lib, f"group_int8_{sfx}")
        fn.argtypes = [p, i64, i64, i64, p, p, p, i64, i64, i64]
        fn.restype = ctypes.c_int
    return lib


@functools.cache
def library() -> ctypes.CDLL | None:
    return build()


def fits(out_features: int, in_features: int, group_size: int, scale: torch.Tensor) -> bool:
    return group_size == GROUP and in_features % GROUP == 0 and out_features % 16 == 0 and scale.dtype == torch.float16


def product(lib: ctypes.CDLL, x: torch.Tensor, values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x @ (values * scale per group).T`` in x's dtype, 1..MAX_ROWS rows with unit column stride."""
    rows, out = x.shape[0], values.shape[0]
    y = torch.empty(rows, out, dtype=x.dtype)
    rc = getattr(lib, f"group_int8_{SUFFIX[x.dtype]}")(
        x.data_ptr(), x.stride(0), rows, x.shape[1], values.data_ptr(), scale.data_ptr(), y.data_ptr(), out, out,
        native.threads())
    if rc:
        raise ValueError(f"group_int8_rows: a product of {rows} rows by {tuple(values.shape)} refused")
    return y
