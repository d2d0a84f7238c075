"""Rank 0's model runner: before each device operation it tells the other ranks to do the same."""

from __future__ import annotations

import contextlib
from typing import Protocol

import torch

from engine.model_runner import ModelRunner
from engine.parallel.messages import Op, StepMessage
from engine.step_inputs import StepInputs


class RankSender(Protocol):
    """What the runner uses of ``TensorParallel`` (a protocol: the driver imports this module)."""

    def send(self, message: StepMessage) -> None: ...

    def guard(self) -> contextlib.AbstractContextManager[None]: ...


class TensorParallelRunner(ModelRunner):
    """A ``ModelRunner`` over rank 0's shard. ``parallel`` is set once every rank's runner is
    built: until then (the start-up profiling step) each rank runs its own identical steps."""

    parallel: RankSender | None = None

    def _forward(self, inputs: StepInputs) -> torch.Tensor:
        parallel = self.parallel
        if parallel is None:
            return super()._forward(inputs)
        with parallel.guard():
            parallel.send(StepMessage.step(inputs))
            return super()._forward(inputs)

    @torch.inference_mode()
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        parallel = self.parallel
        if not pairs or parallel is None:
            return super().copy_blocks(pairs)
        with parallel.guard():
            parallel.send(StepMessage(Op.COPY, pairs=pairs))
            super().copy_blocks(pairs)
