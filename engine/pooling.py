"""Embeddings: what a pooling request asks, which rows of a prompt chunk it reads, and how
those rows' final hidden states become one vector.

A pooling request runs its prompt through the layers and the final norm (never the LM head);
the rows it needs are pooled as its chunks are computed, and it finishes, freeing its KV
blocks, in the step that computes its last pooled position. Mean and cls pooling read
positions from 0 on, so such a request takes nothing from the prefix cache
(``Sequence.max_cached_tokens``); last-token pooling always computes its last token anyway.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.pooling_params import PoolingParams
from engine.sequence import Sequence


def pool_positions(seq: Sequence, computed: int, num_new: int) -> range:
    """Prompt positions of this chunk whose hidden states the sequence's pooling reads."""
    mode = seq.pooling.pooling
    end = computed + num_new
    if mode == "mean":
        return range(computed, end)
    if mode == "cls":
        return range(0, 1) if computed == 0 else range(0)
    last = seq.num_prompt_tokens - 1
    return range(last, last + 1) if computed <= last < end else range(0)


def accumulate(seq: Sequence, first: int, rows: torch.Tensor) -> np.ndarray | None:
    """Fold a chunk's hidden-state rows (float32, positions ``first...``) into the sequence's
    pooled state; the finished embedding once every position its pooling reads is in, else
    None (``cls`` is done after position 0: in a causal model later tokens cannot change it).
    A chunk from position 0 starts over (a preempted sequence recomputes its prompt)."""
    mode = seq.pooling.pooling
    if mode == "mean":
        total = rows.sum(0)
        seq.pooled = total if first == 0 or seq.pooled is None else seq.pooled + total
        if first + len(rows) < seq.num_prompt_tokens:
            return None
        vector = seq.pooled / seq.num_prompt_tokens
    else:
        vector = rows[0]
    seq.pooled = None
    return finish_vector(vector, seq.pooling)


def finish_vector(vector: torch.Tensor, params: PoolingParams) -> np.ndarray:
    """Truncate to ``dimensions``, then L2-normalise if asked: float32 on the host."""
    if params.dimensions is not None:
        vector = vector[: params.dimensions]
    if params.normalize:
        vector = torch.nn.functional.normalize(vector, dim=0)
    return vector.detach().to("cpu", torch.float32).numpy()
