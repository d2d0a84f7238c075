"""Sizing the KV pool on a GPU: measure the activation peak of one full-budget step."""

from __future__ import annotations

import torch

from engine.config import EngineConfig
from engine.kv_cache import allocate_kv_pool, blocks_from_cuda_memory
from engine.model_runner import ModelRunner
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence


def profile_cuda_blocks(
    model, backend, config: EngineConfig, max_model_len: int, device: str, kv_dtype: torch.dtype, per_block: int
) -> int:
    """Run one step at the full token budget on a throwaway pool to find the activation peak.

    The budget is split into sequences no longer than the context (the rotary table ends
    there), and the probe pool's own bytes are taken out of the peak: the real pool is
    what is being sized.
    """
    dev = torch.device(device)
    bs = config.block_size
    lengths = []
    left = config.max_num_batched_tokens
    while left > 0:
        lengths.append(min(left, max_model_len))
        left -= lengths[-1]
    hf = model.config
    probe_blocks = sum(-(-n // bs) for n in lengths)
    probe_pool = allocate_kv_pool(
        hf.num_hidden_layers,
        backend.kv_cache_shape(probe_blocks, bs, hf.num_key_value_heads, model.head_dim),
        kv_dtype, dev,
    )
    runner = ModelRunner(model, backend, probe_pool, bs, device)
    items, first_block = [], 0
    for i, n in enumerate(lengths):
        seq = Sequence(f"profile-{i}", [0] * n, SamplingParams(max_tokens=1))
        nb = -(-n // bs)
        seq.block_table = list(range(first_block, first_block + nb))
        first_block += nb
        items.append((seq, n))
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    runner.execute(items)
    torch.cuda.synchronize(dev)
    peak = torch.cuda.max_memory_allocated(dev) - probe_pool.numel() * probe_pool.element_size()
    del runner, probe_pool  # the attention layers still view it until the real pool is bound
    return blocks_from_cuda_memory(dev, config.gpu_memory_utilization, peak, per_block)
