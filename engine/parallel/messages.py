"""What rank 0 tells the other ranks before each device operation (pickled over gloo)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import torch

from engine.attention import AttentionMetadata
from engine.config import EngineConfig
from engine.step_inputs import StepInputs


class Op(Enum):
    BUILD = "build"  # load this model's shard and build a runner (a new engine)
    STEP = "step"  # run the model on these inputs
    COPY = "copy"  # copy these KV blocks (forked samples)
    RELEASE = "release"  # the engine closed and left the ranks for the next one: drop the model
    STOP = "stop"  # the engine closed: leave the loop


@dataclass
class Build:
    config: EngineConfig
    model_dir: Path
    max_model_len: int


@dataclass
class StepMessage:
    op: Op
    build: Build | None = None
    input_ids: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    meta: AttentionMetadata | None = None
    logits_indices: torch.Tensor | None = None
    pairs: list[tuple[int, int]] | None = None

    @classmethod
    def step(cls, inputs: StepInputs) -> StepMessage:
        """The model's inputs on the host (the block tables, slots and ids every rank shares)."""
        return cls(Op.STEP, input_ids=inputs.input_ids.cpu(), positions=inputs.positions.cpu(),
                   meta=_meta_to(inputs.meta, "cpu"), logits_indices=inputs.logits_indices.cpu())

    def model_args(self, device: torch.device) -> tuple:
        """``model(...)``'s arguments on ``device``."""
        return (self.input_ids.to(device), self.positions.to(device), _meta_to(self.meta, device),
                self.logits_indices.to(device))


def _meta_to(meta: AttentionMetadata, device) -> AttentionMetadata:
    moved = {f.name: getattr(meta, f.name).to(device) for f in dataclasses.fields(meta)
             if isinstance(getattr(meta, f.name), torch.Tensor)}
    return dataclasses.replace(meta, **moved)
