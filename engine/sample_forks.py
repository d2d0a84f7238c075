"""The other ``n - 1`` samples of a request, forked from its first once its prompt is computed."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from engine.request_intake import RequestIntake
from engine.request_state import RequestState
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.stats import EngineStats


class SampledRows(NamedTuple):
    """A step's sampling rows: the sequences, and the logits row of each."""

    seqs: list[Sequence]
    logits: torch.Tensor


class SampleForks:
    """Creates the forked samples: they share the first's full KV blocks, get a copy of its
    partial block, and sample from the same logits."""

    def __init__(self, scheduler: Scheduler, intake: RequestIntake, stats: EngineStats,
                 copy_blocks: Callable[[list[tuple[int, int]]], None], requests: dict[str, RequestState]) -> None:
        self.scheduler, self.intake, self.stats, self.copy_blocks = scheduler, intake, stats, copy_blocks
        self.requests = requests  # the engine's, by id

    def __call__(self, sample_seqs: list[Sequence], logits: torch.Tensor) -> SampledRows:
        """The step's sampling rows with the new samples added (each a copy of its parent's row)."""
        seqs, rows, copies = list(sample_seqs), list(range(len(sample_seqs))), []
        block_size = self.scheduler.block_manager.block_size
        for row, parent in enumerate(sample_seqs):
            if not parent.pending_forks:
                continue
            state = self.requests[parent.request_id]
            for index in range(1, parent.pending_forks + 1):
                child = self.intake.new_sequence(state, index)
                pair = self.scheduler.fork(parent, child)
                if pair is not None:
                    copies.append(pair)
                self.stats.on_fork(parent.num_computed_tokens // block_size, pair)
                seqs.append(child)
                rows.append(row)
            parent.pending_forks = 0
        if len(seqs) == len(sample_seqs):
            return SampledRows(seqs, logits)
        self.copy_blocks(copies)
        return SampledRows(seqs, logits[rows])
