"""One scheduled step as flat tensors, sent to the device in one copy.

Every integer a step needs (token ids, positions, slots, lengths, block tables, the rows the LM
head reads, the placeholder fills) is built on the host with whole-tensor ops, packed into one
int64 buffer (pinned on CUDA) and copied with one non-blocking transfer; the device side only
slices and casts views of it. A pageable copy would block the host until the device had drained
the step in flight, which is exactly the wait async scheduling removes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter

import numpy as np
import torch

from engine.attention import AttentionMetadata
from engine.block_table_rows import BlockTableRows
from engine.pooling import pool_positions
from engine.scheduled_batch import ScheduledBatch
from engine.sequence import Sequence

PLACEHOLDER = -1  # token id standing for a token the device is still sampling


@dataclass
class StepInputs:
    """What the model reads for one step, plus which rows of its output go where."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # flat rows the LM head runs on: sampling rows first, then prompt rows
    sample_seqs: list[Sequence] = field(default_factory=list)
    prompt_rows: list[tuple[Sequence, int, int]] = field(default_factory=list)  # (seq, first position, count)
    sample_table_rows: np.ndarray = field(default_factory=lambda: _NONE)  # BlockTableRows row of each sample_seqs
    pool_rows: list[tuple[Sequence, int, int]] = field(default_factory=list)  # (seq, first position, count)
    pool_indices: torch.Tensor | None = None  # flat rows whose final hidden states pool_rows take, in order


def prompt_logit_positions(seq: Sequence, computed: int, num_new: int) -> range:
    """Positions of this chunk whose logits give a prompt logprob (position p scores token p + 1)."""
    if not seq.needs_prompt_logits:
        return range(0)
    first = max(computed, seq.params.prompt_logprobs_start - 1)
    return range(first, min(computed + num_new, seq.num_prompt_tokens - 1))


def build_step_inputs(
    batch: ScheduledBatch, block_size: int, device: torch.device, table_rows: BlockTableRows,
    previous: np.ndarray | None = None, previous_tokens: torch.Tensor | None = None,
) -> StepInputs:
    """The step's tensors on ``device``. Decodes go first so backends can batch them; block
    tables come from the runner's persistent ``table_rows``.

    ``previous`` gives, per ``table_rows`` row, the row of ``previous_tokens`` (on the device)
    that the step still in flight sampled for that row's sequence (-1: none): a placeholder fed
    this step is filled from there."""
    batch = batch.decodes_first()  # the scheduler's batches already are
    nd, n = batch.num_decodes, len(batch)
    seqs, query_lens, context_lens, samples = batch.seqs, batch.num_new_tokens, batch.num_computed_tokens, batch.samples
    q_lens = np.array(query_lens, np.int64)
    ctx = np.array(context_lens, np.int64)
    lens = ctx + q_lens
    seq_lens, max_seq_len = lens.tolist(), int(lens.max())
    rows = table_rows.rows_for(seqs)

    fill_at = fill_from = _NONE
    if previous is None:
        decode_ids = np.array([s.token_ids[c] for s, c in zip(seqs[:nd], context_lens[:nd], strict=True)], np.int64)
    else:
        # A decode whose input is its placeholder (its token of the step in flight) reads it from
        # that step's tokens; a prompt chunk never carries one (it has not sampled yet). Only the
        # other decodes' inputs are read on the host.
        pending = np.fromiter(map(_PENDING, seqs[:nd]), np.int64, nd)  # attrgetter in C
        fill_at = np.flatnonzero(pending)
        fill_from = _lookup(previous, rows[fill_at])
        if (fill_from < 0).any():
            raise RuntimeError("a placeholder's sequence did not sample in the step in flight")
        decode_ids = np.full(nd, PLACEHOLDER, np.int64)
        for i in np.flatnonzero(pending == 0).tolist():
            decode_ids[i] = seqs[i].token_ids[context_lens[i]]
    chunk_ids: list[int] = []
    for s, c, q in zip(seqs[nd:], context_lens[nd:], query_lens[nd:], strict=True):
        chunk_ids.extend(s.token_ids[c : c + q])
    num_tokens = nd + len(chunk_ids)

    # Host arithmetic in numpy: a list of ints becomes an array about ten times faster than a tensor.
    bs = block_size
    width = -(-max_seq_len // bs)
    tables = table_rows.gather(rows, width)
    qsl = np.zeros(n + 1, np.int64)
    np.cumsum(q_lens, out=qsl[1:])
    if nd == n:
        positions, slot_mapping = ctx, tables[np.arange(n), ctx // bs] * bs + ctx % bs
    else:
        seq_index = np.repeat(np.arange(n), q_lens)
        positions = np.arange(num_tokens) - (qsl[:-1] - ctx)[seq_index]
        slot_mapping = tables[seq_index, positions // bs] * bs + positions % bs

    pool_rows: list[tuple[Sequence, int, int]] = []
    pool_indices: list[int] = []
    if batch.wants_hidden:  # embedding requests: hidden-state rows instead of a sample
        samples = [smp and seq.pooling is None for seq, smp in zip(seqs, samples, strict=True)]
        for i, (seq, q, c) in enumerate(zip(seqs, query_lens, context_lens, strict=True)):
            wanted = pool_positions(seq, c, q) if seq.pooling is not None else range(0)
            if wanted:
                start = int(qsl[i]) - c
                pool_indices.extend(range(start + wanted.start, start + wanted.stop))
                pool_rows.append((seq, wanted.start, len(wanted)))
    # (a list of bools becomes an array 2.5x faster through fromiter than through flatnonzero)
    sample_rows = np.flatnonzero(np.fromiter(samples, bool, n))
    indices = qsl[1:][sample_rows] - 1
    prompt_rows = []
    if batch.wants_prompt_logits:
        prompt_indices: list[int] = []
        for i, (seq, q, c) in enumerate(zip(seqs, query_lens, context_lens, strict=True)):
            wanted = prompt_logit_positions(seq, c, q)
            if wanted:
                start = int(qsl[i]) - c  # flat row of position 0 of this sequence
                prompt_indices.extend(range(start + wanted.start, start + wanted.stop))
                prompt_rows.append((seq, wanted.start, len(wanted)))
        indices = np.concatenate([indices, np.array(prompt_indices, np.int64)])

    parts = [decode_ids, np.array(chunk_ids, np.int64), positions, slot_mapping, qsl, lens, ctx,
             tables.reshape(-1), indices, fill_at, fill_from]
    sizes = [len(p) for p in parts]
    packed = torch.from_numpy(np.concatenate(parts))
    if device.type == "cuda":
        packed = packed.pin_memory().to(device, non_blocking=True)
    ids, pos, slots, qsl_d, lens_d, ctx_d, tables_d, idx_d, at_d, from_d = packed.split([sizes[0] + sizes[1], *sizes[2:]])
    if len(fill_at):
        ids = ids.index_copy(0, at_d, previous_tokens.index_select(0, from_d).to(torch.int64))
    meta = AttentionMetadata(
        query_start_loc=qsl_d.to(torch.int32),
        seq_lens=lens_d.to(torch.int32),
        context_lens=ctx_d.to(torch.int32),
        slot_mapping=slots,
        block_tables=tables_d.view(n, width).to(torch.int32),
        block_size=bs,
        num_decodes=nd,
        max_query_len=int(q_lens.max()),
        max_seq_len=max_seq_len,
        query_lens_host=query_lens,
        seq_lens_host=seq_lens,
        context_lens_host=context_lens,
    )
    if len(sample_rows) == n:
        sample_seqs, sample_table_rows = list(seqs), rows
    else:
        sample_seqs, sample_table_rows = list(compress(seqs, samples)), rows[sample_rows]
    pool_d = torch.tensor(pool_indices, dtype=torch.int64, device=device) if pool_rows else None
    return StepInputs(ids, pos, meta, idx_d, sample_seqs, prompt_rows, sample_table_rows, pool_rows, pool_d)


_NONE = np.zeros(0, np.int64)
_PENDING = attrgetter("num_pending_tokens")


def _lookup(previous: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``previous[rows]``, -1 past its end (a row the step in flight had not reached)."""
    out = np.full(len(rows), -1, np.int64)
    inside = rows < len(previous)
    out[inside] = previous[rows[inside]]
    return out


def token_rows_by_table_row(sample_table_rows: np.ndarray) -> np.ndarray:
    """Per table row, the row of a step's sampled tokens that belongs to it (-1: none)."""
    out = np.full(int(sample_table_rows.max()) + 1 if len(sample_table_rows) else 0, -1, np.int64)
    out[sample_table_rows] = np.arange(len(sample_table_rows))
    return out
