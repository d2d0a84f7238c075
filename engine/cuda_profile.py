"""Sizing the KV pool on a GPU: measure the activation peak of one full-budget step."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from engine.kv_cache import blocks_from_cuda_memory
from engine.sampling_params import SamplingParams
from engine.scheduled_batch import ScheduledBatch, ScheduledSequence
from engine.sequence import Sequence


class ProfiledRunner(Protocol):
    """What sizing uses of the model runner (a protocol: the runner imports this module)."""

    device: torch.device
    block_size: int

    def allocate_kv_pool(self, num_blocks: int) -> torch.Tensor: ...

    def bind_kv_pool(self, pool: torch.Tensor | None) -> None: ...

    def execute(self, batch: ScheduledBatch) -> Any: ...


def profile_cuda_blocks(
    runner: ProfiledRunner, max_num_batched_tokens: int, max_model_len: int, utilization: float, per_block: int
) -> int:
    """Run one step at the full token budget on a throwaway pool to find the activation peak.

    The budget is split into sequences no longer than the context (the rotary table ends
    there), and the probe pool's own bytes are taken out of the peak: the real pool is
    what is being sized. The runner lets go of the probe pool before returning.
    """
    dev = runner.device
    bs = runner.block_size
    lengths = []
    left = max_num_batched_tokens
    while left > 0:
        lengths.append(min(left, max_model_len))
        left -= lengths[-1]
    probe_pool = runner.allocate_kv_pool(sum(-(-n // bs) for n in lengths))
    runner.bind_kv_pool(probe_pool)
    batch, first_block = ScheduledBatch(step=0), 0
    for i, n in enumerate(lengths):
        seq = Sequence(f"profile-{i}", [0] * n, SamplingParams(max_tokens=1))
        nb = -(-n // bs)
        seq.block_table = list(range(first_block, first_block + nb))
        seq.block_table_version += 1
        first_block += nb
        batch.append(ScheduledSequence(seq, n, 0, samples=True))
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    runner.execute(batch)
    torch.cuda.synchronize(dev)
    peak = torch.cuda.max_memory_allocated(dev) - probe_pool.numel() * probe_pool.element_size()
    runner.bind_kv_pool(None)
    del probe_pool
    # Hand the probe pool and the step's activations back to the driver: memory the caching
    # allocator still reserves would read as used by others and be taken off the pool twice.
    torch.cuda.empty_cache()
    return blocks_from_cuda_memory(dev, utilization, peak, per_block)
