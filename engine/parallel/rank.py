"""One rank's share of the engine: its shard of the model and a runner with its KV heads."""

from __future__ import annotations

import os
from pathlib import Path

from engine.attention import get_backend
from engine.config import EngineConfig
from engine.device_features import announce, choose_features
from engine.host import tune_for_cpu
from engine.model_loader import load_model
from engine.model_runner import ModelRunner
from engine.parallel.group import ParallelGroup
from engine.parallel.shard import shard_model


def tune_rank_threads(num_threads: int | None, size: int) -> None:
    """On a CPU the ranks share the cores: each takes its part unless ``num_threads`` is set."""
    tune_for_cpu(num_threads or max(1, len(os.sched_getaffinity(0)) // size))


def build_rank_runner(
    config: EngineConfig, model_dir: Path, max_model_len: int, group: ParallelGroup,
    runner_cls: type[ModelRunner] = ModelRunner,
) -> ModelRunner:
    """Load and shard the model, and build the runner. Every rank calls this at the same time
    (the loads overlap: each reads the whole checkpoint on the host, keeps its shard and moves
    only that to its device). CUDA graphs are off: the collectives run eagerly."""
    device = str(group.device)
    model = load_model(model_dir, config.torch_dtype, device, max_model_len, "none",  # quantized: dequantised
                       shard=lambda m: shard_model(m, group))
    features = choose_features(device, config.attention_backend, True, config.num_kv_blocks, config.compile,
                               model.head_dim)
    if group.rank == 0:
        announce(features)
    backend = get_backend(features.attention_backend, device)
    runner = runner_cls(model, backend, config, max_model_len, device, features)
    agreed = group.agree_min(runner.num_kv_blocks)  # every rank's pool holds the same block ids
    if agreed != runner.num_kv_blocks:
        runner.bind_kv_pool(None)
        runner.num_kv_blocks = agreed
        runner.bind_kv_pool(runner.allocate_kv_pool(agreed))
    return runner
