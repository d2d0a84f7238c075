"""Embeddings: what a pooling request asks, which rows of a prompt chunk it reads, and how
those rows' final hidden states become one vector.

A pooling request runs its prompt through the layers and the final norm (never the LM head);
the rows it needs are pooled as its chunks are computed, and it finishes, freeing its KV
blocks, in the step that computes its last pooled position. Mean and cls pooling read
positions from 0 on, so such a request takes nothing from the prefix cache
(``Sequence.max_cached_tokens``); last-token pooling always computes its last token anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from engine.pooling_config import ModelPooling
from engine.sequence import Sequence

POOLING_MODES = ("last", "mean", "cls")


@dataclass
class PoolingParams:
    """How one prompt becomes a vector. ``pooling`` None: the model's own (``pooling_config``);
    ``normalize`` None: as the model says; ``dimensions``: keep the first ``dimensions`` values
    (Matryoshka), then normalise. ``resolved`` fills the model's choices in at intake."""

    pooling: str | None = None
    normalize: bool | None = None  # None: as the model's own
    dimensions: int | None = None
    n: ClassVar[int] = 1  # one sequence, no generated token: what a request's share counts
    max_tokens: ClassVar[int] = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, hidden_size: int | None = None) -> None:
        if self.pooling is not None and self.pooling not in POOLING_MODES:
            raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)}, got {self.pooling!r}")
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise ValueError(f"normalize must be true or false, got {self.normalize!r}")
        d = self.dimensions
        if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 1):
            raise ValueError(f"dimensions must be an integer >= 1, got {d!r}")
        if d is not None and hidden_size is not None and d > hidden_size:
            raise ValueError(f"dimensions must be at most the model's {hidden_size}, got {d}")


    def resolved(self, own: ModelPooling) -> PoolingParams:
        return PoolingParams(self.pooling or own.pooling, own.normalize if self.normalize is None else self.normalize,
                             self.dimensions)


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
