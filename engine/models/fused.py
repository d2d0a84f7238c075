"""Fused element-wise steps of the decoder layer (``engine/native/fused_ops.c``), each with the
torch formulation it replaces as the fallback (another device, no C compiler, a head size the
kernel does not take) and as the tests' reference.

Why: a layer ran about 40 small eager ops besides its four products (RMSNorm alone is seven,
rotary fourteen, the KV write six), each a dispatch and, for big steps, a pass over memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.native import fused_fn as _fn
from engine.native import threads as _threads

MAX_HEAD_DIM = 512  # the rotary kernel's per-head scratch


def _triton_fused():
    """The Triton versions for CUDA tensors (``fused_triton.py``), or None without triton."""
    try:
        from engine.models import fused_triton  # lazy: triton is optional
    except ImportError:
        return None
    return fused_triton


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """``weight * norm(x)``, or with ``residual``: ``residual += x`` first (in place) and the norm
    of the new residual. Returns ``(normed, residual)``; without one, the residual is ``x``."""
    if x.is_cuda and x.dim() == 2 and x.stride(-1) == 1 and (residual is None or residual.stride(-1) == 1):
        triton_fused = _triton_fused()
        if triton_fused is not None and triton_fused.usable(x, weight):
            return triton_fused.rms_norm(x, weight, eps, residual)
    fn = _fn("rms_norm" if residual is None else "add_rms_norm", x, weight)
    if fn is None or x.dim() != 2 or not x.is_contiguous() or (residual is not None and not residual.is_contiguous()):
        if residual is None:
            return rms_norm_reference(x, weight, eps), x
        residual.add_(x)
        return rms_norm_reference(residual, weight, eps), residual
    out = torch.empty_like(x)
    rows, hidden = x.shape
    if residual is None:
        fn(x.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, hidden, eps, _threads())
        return out, x
    fn(x.data_ptr(), residual.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, hidden, eps, _threads())
    return out, residual


def rotary_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def rotary_(qkv: torch.Tensor, num_heads: int, head_dim: int, positions: torch.Tensor,
            cos_table: torch.Tensor, sin_table: torch.Tensor) -> None:
    """Rotate the first ``num_heads`` heads of every ``qkv`` row in place (the q and k heads of a
    fused projection); cos/sin are float32 ``[positions, head_dim]`` tables."""
    if (qkv.is_cuda and qkv.dim() == 2 and qkv.stride(1) == 1 and head_dim >= 2 and head_dim & (head_dim - 1) == 0
            and cos_table.dtype == torch.float32 and cos_table.is_contiguous() and sin_table.is_contiguous()):
        triton_fused = _triton_fused()
        if triton_fused is not None and triton_fused.usable(qkv, cos_table):
            triton_fused.rotary_(qkv, num_heads, head_dim, positions, cos_table, sin_table)
            return
    fn = _fn("rotary", qkv)
    ok = (fn is not None and qkv.dim() == 2 and qkv.stride(1) == 1 and head_dim % 2 == 0
          and head_dim <= MAX_HEAD_DIM and positions.dtype == torch.int64 and positions.is_contiguous()
          and cos_table.dtype == torch.float32 and cos_table.is_contiguous() and sin_table.is_contiguous())
    if not ok:
        heads = qkv[:, : num_heads * head_dim].view(-1, num_heads, head_dim)
        cos = cos_table[positions].to(qkv.dtype).unsqueeze(1)
        sin = sin_table[positions].to(qkv.dtype).unsqueeze(1)
        heads.copy_(rotary_reference(heads, cos, sin))
        return
    fn(qkv.data_ptr(), cos_table.data_ptr(), sin_table.data_ptr(), positions.data_ptr(), qkv.shape[0],
       qkv.stride(0), num_heads, head_dim, _threads())


def act_and_mul(gate_up: torch.Tensor, intermediate: int, act_name: str, act) -> torch.Tensor:
    """``act(gate) * up`` for the gated MLP's ``gate_up = [gate | up]`` rows, as a new tensor; ``act``
    is the torch function ``act_name`` names in ``layers.ACTIVATIONS`` (not imported: it imports us).

    Why: on CUDA torch's ``act(gate).mul_(up)`` is two elementwise kernels on strided halves."""
    if (gate_up.is_cuda and gate_up.dim() == 2 and gate_up.stride(1) == 1
            and gate_up.shape[1] == 2 * intermediate):
        triton_fused = _triton_fused()
        if (triton_fused is not None and triton_fused.usable(gate_up) and act_name in triton_fused.ACTIVATIONS
                and gate_up.dtype in triton_fused.DTYPES):
            return triton_fused.act_and_mul(gate_up, intermediate, act_name)
    gate, up = gate_up[:, :intermediate], gate_up[:, intermediate:]
    return (F.silu(gate) if act_name == "silu" else act(gate)).mul_(up)
