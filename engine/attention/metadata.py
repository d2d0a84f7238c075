"""The flat description of one step that every attention backend reads."""

from __future__ import annotations

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
