"""The flat description of one step that every attention backend reads."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Layout of a step's tokens in one flat batch.

    Sequences appear in batch order; sequence ``i`` owns query rows
    ``query_start_loc[i]:query_start_loc[i+1]``. The first ``num_decodes`` sequences
    have exactly one query token (decodes); the rest are prefill chunks. A sequence's
    keys for positions ``< seq_lens[i]`` sit in the block pool at
    ``block_tables[i, pos // block_size] * block_size + pos % block_size`` once this
    step's keys are written through ``slot_mapping``.
    """

    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32, cached context + this step's tokens
    context_lens: torch.Tensor  # [B] int32, tokens already in the cache before this step
    slot_mapping: torch.Tensor  # [T] int64, destination slot of every new token
    block_tables: torch.Tensor  # [B, max_blocks] int32, padded with 0
    block_size: int
    num_decodes: int
    max_query_len: int
    max_seq_len: int
    # Host copies, so CPU backends can loop without device syncs.
    query_lens_host: list[int]
    seq_lens_host: list[int]
    context_lens_host: list[int]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_host)

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @functools.cached_property
    def per_token(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every query token as a one-token sequence: its block-table row ``[T, max_blocks]``
        and the context it sees ``[T]`` (its position + 1: cached context, earlier tokens of its
        chunk, itself). With this a decode kernel runs prefill chunks too, reading the keys
        in place. Built once per step and shared by every layer."""
        dev = self.block_tables.device
        counts = torch.tensor(self.query_lens_host, device=dev)
        seq = torch.repeat_interleave(torch.arange(self.num_seqs, device=dev), counts)
        tables = self.block_tables.index_select(0, seq)
        offset = torch.arange(seq.shape[0], device=dev) - self.query_start_loc[:-1].to(dev)[seq]
        lens = (self.context_lens.to(dev)[seq] + offset + 1).to(torch.int32)
        return tables, lens
