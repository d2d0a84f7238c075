"""Triton kernels that read and write the paged KV pool directly through block tables.

Pool layout per layer: ``[num_blocks, block_size, num_kv_heads, head_dim]``, contiguous, so a
token at position ``p`` of sequence ``i`` lives at block ``block_tables[i, p // block_size]``,
row ``p % block_size``. Every kernel turns a tile of token positions into per-token row
addresses with that formula and issues one gathered load; nothing copies the pool.

All softmax arithmetic is float32 in the log2 domain (scores are pre-multiplied by
``scale * log2(e)`` so ``exp2`` can be used); outputs are cast to the output dtype at the store.
Dots run with ``input_precision="ieee"`` (no TF32 for float32 inputs) and take their operands
in ``DOT_DTYPE``: the input dtype on a GPU, float32 for bfloat16 under the interpreter, whose
``tl.dot`` multiplies bfloat16's raw uint16 storage (triton 3.9). bfloat16 products are exact
in float32, so the upcast changes only the accumulation order, not what is computed.
See ``engine/attention/README.md`` for the layout and how each kernel walks it.

An FP8 pool (``float8_e4m3fn``, ``engine/kv_cache.py``): ``write_kv_kernel`` stores
``round(x * inv_scale)`` saturated to +-448 (``KV_FP8``); the attention kernels load E4M3 keys and
values, widen them to ``DOT_DTYPE`` (exact: every E4M3 value is a bfloat16 one) and apply the
scales outside the dots: the host folds the key scale into ``qk_scale``, and the value scale
multiplies the accumulator (``v_scale``; 1.0 for other pools). ``p`` is rounded to the output's
dtype before its dot, which for a 16-bit pool is the pool's dtype, as before.
"""

from __future__ import annotations

import triton
import triton.language as tl

from engine.quant.fp8_triton import round_e4m3


@triton.jit
def write_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cs, stride_ch, inv_k_scale, inv_v_scale,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEADS_PAD: tl.constexpr, KV_FP8: tl.constexpr,
):
    """One program per new token: copy all its KV heads to its slot; slot -1 (padding) is skipped.
    ``KV_FP8``: store ``x * inv_scale`` rounded to E4M3 instead of a plain copy."""
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, HEAD_DIM)
    mask = h[:, None] < NUM_KV_HEADS
    src_k = key_ptr + t.to(tl.int64) * stride_kt + h[:, None] * stride_kh + d[None, :]
    src_v = value_ptr + t.to(tl.int64) * stride_vt + h[:, None] * stride_vh + d[None, :]
    dst = slot * stride_cs + h[:, None] * stride_ch + d[None, :]
    k = tl.load(src_k, mask=mask)
    v = tl.load(src_v, mask=mask)
    if KV_FP8:
        k = round_e4m3(tl.minimum(tl.maximum(k.to(tl.float32) * inv_k_scale, -448.0), 448.0))
        v = round_e4m3(tl.minimum(tl.maximum(v.to(tl.float32) * inv_v_scale, -448.0), 448.0))
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, part_acc_ptr, part_ml_ptr,
    qk_scale, v_scale, window,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_cs, stride_ch, stride_bt,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    """Grid (decode, kv_head, split): the GROUP query heads sharing one KV head attend over
    every NUM_SPLITS-th tile of BLOCK_N positions, starting at tile ``split``, so each KV tile is
    loaded once per group.

    Interleaved tiles rather than one contiguous partition per split: the splits share any
    context length evenly, also inside a CUDA graph, whose split count is fixed at capture for
    the longest possible context (contiguous partitions of 4,096 / splits positions left every
    split but the first idle on contexts of a few hundred tokens).

    With NUM_SPLITS == 1 the program normalises and writes the output; otherwise it writes its
    unnormalised accumulator plus running max/sum for ``reduce_splits_kernel``. Only the last
    ``window`` positions are read (a sliding window; the host passes a huge one for none).
    """
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    heads = kvh * GROUP + g
    g_mask = g < GROUP
    q = tl.load(q_ptr + seq.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + d[None, :],
                mask=g_mask[:, None], other=0.0).to(DOT_DTYPE)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    lo = tl.maximum(seq_len - window, 0)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for n0 in range(lo + split * BLOCK_N, seq_len, NUM_SPLITS * BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        valid = pos < seq_len
        block = tl.load(table + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        row = block * stride_cb + (pos % BLOCK_SIZE) * stride_cs + kvh * stride_ch
        k = tl.load(k_cache_ptr + row[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(DOT_DTYPE)
        v = tl.load(v_cache_ptr + row[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(DOT_DTYPE)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        # Round p to the output (query) dtype as the tensor-core path would, then feed the dot.
        p_dot = p.to(out_ptr.dtype.element_ty).to(DOT_DTYPE)
        acc = acc * alpha[:, None] + tl.dot(p_dot, v, input_precision="ieee")
        m_i = m_new

    if NUM_SPLITS == 1:
        l_safe = tl.where(l_i > 0, l_i, 1.0)  # a padded (seq_len 0) decode writes zeros, not NaN
        o = acc * v_scale / l_safe[:, None]
        dst = out_ptr + seq.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + d[None, :]
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])
    else:
        # Partial buffers: acc [n, num_heads, NUM_SPLITS, HEAD_DIM], (m, l) [n, num_heads, NUM_SPLITS, 2].
        num_heads = tl.num_programs(1) * GROUP
        base = (seq.to(tl.int64) * num_heads + heads) * NUM_SPLITS + split
        tl.store(part_acc_ptr + base[:, None] * HEAD_DIM + d[None, :], acc * v_scale, mask=g_mask[:, None])
        tl.store(part_ml_ptr + base * 2, m_i, mask=g_mask)
        tl.store(part_ml_ptr + base * 2 + 1, l_i, mask=g_mask)


@triton.jit
def reduce_splits_kernel(
    part_acc_ptr, part_ml_ptr, out_ptr, stride_ot, stride_oh,
    NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    """Grid (decode, head): merge the splits' softmax states into the final output."""
    seq = tl.program_id(0)
    h = tl.program_id(1)
    num_heads = tl.num_programs(1)
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_DIM)
    s_mask = s < NUM_SPLITS
    base = (seq.to(tl.int64) * num_heads + h) * NUM_SPLITS + s
    m = tl.load(part_ml_ptr + base * 2, mask=s_mask, other=float("-inf"))
    l_part = tl.load(part_ml_ptr + base * 2 + 1, mask=s_mask, other=0.0)
    acc = tl.load(part_acc_ptr + base[:, None] * HEAD_DIM + d[None, :], mask=s_mask[:, None], other=0.0)
    m_max = tl.max(m, 0)
    # Empty splits (a context of fewer tiles than splits) carry m = -inf and weigh 0; split 0 is never empty
    # unless seq_len is 0, which the where() keeps finite.
    w = tl.where(m > float("-inf"), tl.exp2(m - m_max), 0.0)
    denom = tl.sum(w * l_part, 0)
    denom = tl.where(denom > 0, denom, 1.0)
    o = tl.sum(acc * w[:, None], 0) / denom
    tl.store(out_ptr + seq.to(tl.int64) * stride_ot + h * stride_oh + d, o.to(out_ptr.dtype.element_ty))


@triton.jit
def extend_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, query_start_loc_ptr, seq_lens_ptr, context_lens_ptr,
    out_ptr, qk_scale, v_scale, first_seq, window,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_cs, stride_ch, stride_bt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    """Grid (sequence, query tile, head): causal attention of up to BLOCK_M new tokens over the
    sequence's whole KV (cached context and this step's tokens, all read from the pool).

    Query row j sits at absolute position context_len + j and sees keys 0..context_len + j, or
    with a sliding window only the last ``window`` of them (the host passes a huge one for none).
    """
    seq = first_seq + tl.program_id(0)
    tile = tl.program_id(1)
    h = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    m0 = tile * BLOCK_M
    if m0 >= q_len:
        return
    ctx = tl.load(context_lens_ptr + seq)
    seq_len = tl.load(seq_lens_ptr + seq)
    kvh = h // GROUP

    rows = m0 + tl.arange(0, BLOCK_M)
    row_mask = rows < q_len
    q_pos = ctx + tl.minimum(rows, q_len - 1)  # padding rows act as the last real one: never all masked
    d = tl.arange(0, HEAD_DIM)
    tok = (q_start + rows).to(tl.int64)
    q_ptrs = q_ptr + tok[:, None] * stride_qt + h * stride_qh + d[None, :]
    q = tl.load(q_ptrs, mask=row_mask[:, None], other=0.0).to(DOT_DTYPE)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # The last real row of this tile sees keys up to ctx + min(m0 + BLOCK_M, q_len) - 1.
    kv_end = tl.minimum(ctx + m0 + BLOCK_M, seq_len)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    # The tile's first row sees keys from ctx + m0 - window + 1: nothing before is read.
    for n0 in range(tl.maximum(ctx + m0 - window + 1, 0), kv_end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        valid = pos < kv_end
        block = tl.load(table + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        row = block * stride_cb + (pos % BLOCK_SIZE) * stride_cs + kvh * stride_ch
        k = tl.load(k_cache_ptr + row[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(DOT_DTYPE)
        v = tl.load(v_cache_ptr + row[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(DOT_DTYPE)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        # Every row sees its own key, so no row's max stays -inf.
        seen = (pos[None, :] <= q_pos[:, None]) & (pos[None, :] > q_pos[:, None] - window)
        s = tl.where(valid[None, :] & seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        # Round p to the output (query) dtype as the tensor-core path would, then feed the dot.
        p_dot = p.to(out_ptr.dtype.element_ty).to(DOT_DTYPE)
        acc = acc * alpha[:, None] + tl.dot(p_dot, v, input_precision="ieee")
        m_i = m_new

    o = acc * v_scale / l_i[:, None]
    dst = out_ptr + tok[:, None] * stride_ot + h * stride_oh + d[None, :]
    tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])
