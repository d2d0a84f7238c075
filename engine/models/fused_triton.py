"""The fused element-wise steps of ``fused.py`` as Triton kernels, for CUDA tensors.

Why: on a GPU the torch formulations launch about 20 small kernels per layer (RMSNorm seven,
rotary fourteen). A profile of a 1B model's bfloat16 decode step on an H200 showed them at
about 40% of device time and most of the host launch time of the eager (prefill) steps.
The gated MLP's ``act(gate) * up`` ran as two elementwise kernels on the strided halves of
``gate_up``: about 20% of device time in a 1B model's profile on an H100.
Each kernel here rounds to the tensor's dtype exactly where the torch reference does
(``rms_norm_reference``, ``rotary_reference``, ``act(gate).mul_(up)``), so only float32
summation order differs.
``TOKENMILL_TRITON_FUSED=0`` keeps the torch formulations (for A/B measurements).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

ENABLED = os.environ.get("TOKENMILL_TRITON_FUSED", "1") != "0"


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, stride_x, stride_r, stride_o, hidden, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    """One row per program: optionally ``residual += x`` (stored), then ``w * norm(residual or x)``."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (r.to(tl.float32) + x.to(tl.float32)).to(r.dtype)
        tl.store(res_ptr + row * stride_r + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x32 * x32, axis=0) / hidden + eps)
    normed = (x32 * rstd).to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None):
    """As ``fused.rms_norm`` (same return value), for 2-D CUDA tensors with dense rows."""
    rows, hidden = x.shape
    out = torch.empty_like(x)
    if rows:
        res = residual if residual is not None else x
        block = triton.next_power_of_2(hidden)
        _rms_norm_kernel[(rows,)](
            x, res, weight, out, x.stride(0), res.stride(0), out.stride(0), hidden, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=max(1, min(16, block // 256)),
        )
    return out, (residual if residual is not None else x)


@triton.jit
def _rotary_kernel(qkv_ptr, pos_ptr, cos_ptr, sin_ptr, stride_t, stride_table,
                   NUM_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                   HALF: tl.constexpr):
    """One token per program: rotate its first NUM_HEADS heads in place,
    ``x * cos + cat(-x2, x1) * sin`` with cos/sin and each product rounded to the dtype."""
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, HALF)
    mask = h[:, None] < NUM_HEADS
    base = qkv_ptr + t * stride_t + h[:, None] * HEAD_DIM + d[None, :]
    x1 = tl.load(base, mask=mask, other=0.0)
    x2 = tl.load(base + HALF, mask=mask, other=0.0)
    dt = x1.dtype
    table = pos * stride_table + d
    c1 = tl.load(cos_ptr + table).to(dt).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + table + HALF).to(dt).to(tl.float32)[None, :]
    s1 = tl.load(sin_ptr + table).to(dt).to(tl.float32)[None, :]
    s2 = tl.load(sin_ptr + table + HALF).to(dt).to(tl.float32)[None, :]
    a1 = (x1.to(tl.float32) * c1).to(dt).to(tl.float32)
    b1 = (-x2.to(tl.float32) * s1).to(dt).to(tl.float32)
    a2 = (x2.to(tl.float32) * c2).to(dt).to(tl.float32)
    b2 = (x1.to(tl.float32) * s2).to(dt).to(tl.float32)
    tl.store(base, (a1 + b1).to(dt), mask=mask)
    tl.store(base + HALF, (a2 + b2).to(dt), mask=mask)


def rotary_(qkv: torch.Tensor, num_heads: int, head_dim: int, positions: torch.Tensor,
            cos_table: torch.Tensor, sin_table: torch.Tensor) -> None:
    """As ``fused.rotary_``; needs a power-of-two ``head_dim`` and dense head rows."""
    if qkv.shape[0]:
        _rotary_kernel[(qkv.shape[0],)](
            qkv, positions, cos_table, sin_table, qkv.stride(0), cos_table.stride(0),
            NUM_HEADS=num_heads, HEADS_PAD=triton.next_power_of_2(num_heads), HEAD_DIM=head_dim,
            HALF=head_dim // 2, num_warps=4,
        )


# layers.ACTIVATIONS' names -> the kernel's ACT
ACTIVATIONS = {"silu": "silu", "gelu_tanh": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _act_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, inter,
                        ACT: tl.constexpr, EXACT: tl.constexpr, BLOCK: tl.constexpr):
    """Grid (rows, column blocks): ``out = act(gate) * up`` from the row ``[gate | up]``, ``act``
    rounded to the dtype before the product as torch's two kernels round it. The activation is
    torch's CUDA formula, with libdevice's expf/tanhf and an IEEE division where EXACT (compiled:
    the interpreter has no libdevice) so that it matches torch bit for bit."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = x_ptr + row * stride_x + cols
    g = tl.load(gate, mask=mask, other=0.0)
    u = tl.load(gate + inter, mask=mask, other=0.0).to(tl.float32)
    x = g.to(tl.float32)
    if ACT == "silu":
        if EXACT:
            a = tl.math.div_rn(x, 1.0 + libdevice.exp(-x))
        else:
            a = x / (1.0 + tl.exp(-x))
    else:  # gelu_tanh
        inner = 0.7978845608028654 * (x + 0.044715 * (x * x * x))
        if EXACT:
            t = libdevice.tanh(inner)
        else:
            e = tl.exp(-2.0 * tl.abs(inner))  # tanh(|y|) = (1 - e) / (1 + e), without overflow
            t = tl.where(inner < 0, -1.0, 1.0) * (1.0 - e) / (1.0 + e)
        a = 0.5 * x * (1.0 + t)
    a = a.to(g.dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (a * u).to(g.dtype), mask=mask)


_EXACT = isinstance(_act_and_mul_kernel, triton.runtime.JITFunction)


def act_and_mul(gate_up: torch.Tensor, intermediate: int, act: str) -> torch.Tensor:
    """As ``fused.act_and_mul``, for a 2-D CUDA ``gate_up`` [T, 2 * intermediate] with dense rows, a
    dtype in DTYPES and an ``act`` in ACTIVATIONS. Rows and column blocks each get programs, so
    both a wide intermediate and many rows fill the GPU."""
    rows = gate_up.shape[0]
    out = torch.empty(rows, intermediate, dtype=gate_up.dtype, device=gate_up.device)
    if rows and intermediate:
        block = min(1024, triton.next_power_of_2(intermediate))
        _act_and_mul_kernel[(rows, triton.cdiv(intermediate, block))](
            gate_up, out, gate_up.stride(0), out.stride(0), intermediate, ACT=ACTIVATIONS[act], EXACT=_EXACT,
            BLOCK=block, num_warps=max(1, min(4, block // 256)),
            enable_fp_fusion=True,  # contract a * b + c to fma as nvcc (torch's kernels) does
        )
    return out


def usable(*tensors: torch.Tensor) -> bool:
    """CUDA tensors (the interpreter is for the kernels' own tests: see tests/engine/test_fused_triton.py)."""
    return ENABLED and all(t.is_cuda for t in tensors)
