"""A request as the engine tracks it: its ``n`` sample sequences and what they share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.outputs import PositionLogprobs
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence


@dataclass(eq=False)
class RequestState:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence] = field(default_factory=list)  # sample 0 first; the others once forked
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    num_finished: int = 0
    error: str | None = None
    embedding: Any = None  # an embedding request's vector (float32 numpy), once pooled
    seed: int | None = None  # sample i draws from seed + i (the request's, or drawn when it came in)
    priority: int = 0  # its samples' place in the scheduler's queues (Scheduler: lower goes first)

    @property
    def finished(self) -> bool:
        return self.num_finished == self.params.n

