"""Rank 0's side of tensor parallelism for one engine: the worker ranks build the model's shards
with it, each step's inputs go to them before rank 0 runs its own, and a rank's failure becomes
one error (``TensorParallelError``) instead of a hang."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.model_loader import load_config
from engine.parallel.messages import Build, Op, StepMessage
from engine.parallel.pool import RankPool, TensorParallelError
from engine.parallel.rank import build_rank_runner, tune_rank_threads
from engine.parallel.runner import TensorParallelRunner
from engine.parallel.shard import check_shardable

__all__ = ["TensorParallel", "TensorParallelError"]

log = logging.getLogger(__name__)


class TensorParallel:
    """The worker ranks of one engine, and rank 0's runner over its own shard."""

    def __init__(self, config: EngineConfig, model_dir: Path, max_model_len: int, device: str) -> None:
        n = config.tensor_parallel_size
        if device.startswith("cuda"):
            base = torch.device(device).index or 0
            if torch.cuda.device_count() < base + n:
                raise ValueError(f"tensor_parallel_size {n} needs GPUs {base}..{base + n - 1}; "
                                 f"{torch.cuda.device_count()} visible")
        check_shardable(load_config(model_dir), n)
        self.failure: TensorParallelError | None = None
        self.pool: RankPool | None = None
        self.pool = RankPool.acquire(n, device, config)
        if device == "cpu":
            tune_rank_threads(config.num_threads, n)  # after the engine's own tuning for one process
        try:
            self.pool.send(StepMessage(Op.BUILD, build=Build(config, model_dir, max_model_len)))
            self.runner = build_rank_runner(config, model_dir, max_model_len, self.pool.group, TensorParallelRunner)
        except Exception as exc:
            self.failure = self.pool.error_from(exc)
            self.close()
            raise self.failure from exc
        self.runner.parallel = self
        log.info("tensor parallel over %d ranks (%s)", n, device)

    def send(self, message: StepMessage) -> None:
        self.pool.send(message)

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Run a collective step; any failure in it ends the group, reported as the failing rank's error."""
        if self.failure is not None:
            raise self.failure
        try:
            yield
        except Exception as exc:
            self.failure = self.pool.error_from(exc)
            raise self.failure from exc

    def close(self, keep_ranks: bool = False) -> None:
        """Stop the worker ranks, or with ``keep_ranks`` leave them (model dropped) for the next
        engine of this size. A failed group is always stopped."""
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.release(keep_ranks, healthy=self.failure is None)
