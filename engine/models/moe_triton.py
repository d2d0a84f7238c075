"""The mixture-of-experts feed-forward as two Triton kernels, for CUDA tensors (and, under
``TRITON_INTERPRET=1``, CPU tensors in the tests).

The step's (token, expert) pairs are sorted by expert and each expert's run padded to a
multiple of ``BLOCK_M``, so a program's rows all use one expert: kernel 1 multiplies a tile of
rows by that expert's gate and up rows and stores ``silu(gate) * up``; kernel 2 multiplies those
by the expert's down projection and scales each row by its routing weight. The host adds the
rows back to their tokens (``index_add_``). Each expert's weights are streamed once per
row tile instead of once per token, and experts no token chose are never touched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

BLOCK_M = 16
_TL = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def interpreted() -> bool:
    return not isinstance(_gate_up_kernel, triton.runtime.JITFunction)


def usable(x: torch.Tensor) -> bool:
    return x.dtype in _TL and (x.is_cuda or (x.device.type == "cpu" and interpreted()))


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, h_ptr, rows_ptr, experts_ptr, hidden, inter,
                    stride_x, stride_we, stride_wn, stride_h,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr):
    """Grid (row tiles, intermediate tiles): ``h[r] = silu(x[tok] @ gate.T) * (x[tok] @ up.T)``."""
    tile = tl.program_id(0)
    n0 = tl.program_id(1) * BLOCK_N
    expert = tl.load(experts_ptr + tile).to(tl.int64)
    r = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    tok = tl.load(rows_ptr + r)
    live = tok >= 0
    n = n0 + tl.arange(0, BLOCK_N)
    n_ok = n < inter
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    w = w_ptr + expert * stride_we
    for k0 in range(0, hidden, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < hidden
        xs = tl.load(x_ptr + tl.maximum(tok, 0).to(tl.int64)[:, None] * stride_x + k[None, :],
                     mask=live[:, None] & k_ok[None, :], other=0.0).to(DOT)
        g = tl.load(w + n[None, :] * stride_wn + k[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0).to(DOT)
        u = tl.load(w + (n[None, :] + inter) * stride_wn + k[:, None], mask=n_ok[None, :] & k_ok[:, None],
                    other=0.0).to(DOT)
        acc_g = tl.dot(xs, g, acc_g, input_precision="ieee")
        acc_u = tl.dot(xs, u, acc_u, input_precision="ieee")
    h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    tl.store(h_ptr + r.to(tl.int64)[:, None] * stride_h + n[None, :], h.to(h_ptr.dtype.element_ty),
             mask=live[:, None] & n_ok[None, :])


@triton.jit
def _down_kernel(h_ptr, w_ptr, y_ptr, rows_ptr, experts_ptr, weights_ptr, hidden, inter,
                 stride_h, stride_we, stride_wn, stride_y,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr):
    """Grid (row tiles, hidden tiles): ``y[r] = weight[r] * (h[r] @ down.T)``."""
    tile = tl.program_id(0)
    n0 = tl.program_id(1) * BLOCK_N
    expert = tl.load(experts_ptr + tile).to(tl.int64)
    r = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    live = tl.load(rows_ptr + r) >= 0
    n = n0 + tl.arange(0, BLOCK_N)
    n_ok = n < hidden
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    w = w_ptr + expert * stride_we
    for k0 in range(0, inter, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < inter
        hs = tl.load(h_ptr + r.to(tl.int64)[:, None] * stride_h + k[None, :], mask=live[:, None] & k_ok[None, :],
                     other=0.0).to(DOT)
        d = tl.load(w + n[None, :] * stride_wn + k[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0).to(DOT)
        acc = tl.dot(hs, d, acc, input_precision="ieee")
    scale = tl.load(weights_ptr + r, mask=live, other=0.0).to(tl.float32)
    tl.store(y_ptr + r.to(tl.int64)[:, None] * stride_y + n[None, :], (acc * scale[:, None]).to(y_ptr.dtype.element_ty),
             mask=live[:, None] & n_ok[None, :])


def _layout(ids: torch.Tensor, weights: torch.Tensor, num_experts: int):
    """Pairs sorted by expert (HF's order within one), each expert's run padded to BLOCK_M:
    ``(token of each padded row or -1, its weight, expert of each row tile)``.

    Sizes depend only on the token count (room for the worst padding), and nothing is read back
    to the host, so a decode step with MoE layers can be captured in a CUDA graph; tiles past
    the last expert's run hold no live row and write nothing."""
    num_tokens, top_k = ids.shape
    dev = ids.device
    flat = ids.t().flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = torch.cumsum(padded, 0)
    first = torch.cumsum(counts, 0) - counts
    sorted_experts = flat[order]
    dest = ends[sorted_experts] - padded[sorted_experts] + torch.arange(order.numel(), device=dev) - first[sorted_experts]
    num_tiles = (num_tokens * top_k + num_experts * (BLOCK_M - 1)) // BLOCK_M + 1
    rows = torch.full((num_tiles * BLOCK_M,), -1, dtype=torch.int32, device=dev)
    rows[dest] = (order % num_tokens).to(torch.int32)
    row_weights = torch.zeros(num_tiles * BLOCK_M, dtype=torch.float32, device=dev)
    row_weights[dest] = weights.t().flatten()[order].float()
    tile_starts = torch.arange(num_tiles, device=dev) * BLOCK_M
    tile_experts = torch.searchsorted(ends, tile_starts, right=True).clamp(max=num_experts - 1)
    return rows, row_weights, tile_experts.to(torch.int32)


def fused_moe(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor,
              ids: torch.Tensor, act) -> torch.Tensor:
    """``sum_k weights[t, k] * expert_{ids[t, k]}(x[t])`` for every token; ``act`` must be SiLU
    (``Experts.forward`` sends other activations to ``moe.grouped_moe``)."""
    if act is not F.silu:
        raise ValueError(f"the fused MoE kernel computes SiLU experts only, not {act!r}")
    num_experts, two_inter, hidden = gate_up.shape
    inter = two_inter // 2
    rows, row_weights, tile_experts = _layout(ids, weights, num_experts)
    total = rows.numel()
    x, gate_up, down = x.contiguous(), gate_up.contiguous(), down.contiguous()
    h = torch.empty(total, inter, dtype=x.dtype, device=x.device)
    y = torch.zeros(total, hidden, dtype=x.dtype, device=x.device)  # rows no pair fills stay zero
    dot = tl.float32 if interpreted() or x.dtype == torch.float32 else _TL[x.dtype]
    block_n, block_k = 64, 32
    _gate_up_kernel[(total // BLOCK_M, triton.cdiv(inter, block_n))](
        x, gate_up, h, rows, tile_experts, hidden, inter, x.stride(0), gate_up.stride(0), gate_up.stride(1),
        h.stride(0), BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, DOT=dot)
    _down_kernel[(total // BLOCK_M, triton.cdiv(hidden, block_n))](
        h, down, y, rows, tile_experts, row_weights, hidden, inter, h.stride(0), down.stride(0), down.stride(1),
        y.stride(0), BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, DOT=dot)
    out = torch.zeros_like(x)
    out.index_add_(0, rows.clamp(min=0).long(), y)  # empty rows add their zeros to token 0
    return out
