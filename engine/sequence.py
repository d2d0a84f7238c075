"""A request's whole state as the engine sees it: tokens, progress, KV block table, status."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


@dataclass
class Sequence:
    """One request. The scheduler and block manager work only on these fields.

    ``num_computed_tokens`` counts tokens whose keys/values are in the KV cache; the
    tokens from there to ``len(token_ids)`` still have to be fed to the model.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival: int = 0
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    stop_text_end: int | None = None  # where a stop string starts in the output text
    num_cached_prompt_tokens: int = 0
    num_preemptions: int = 0
    first_scheduled_step: int | None = None
    finished_step: int | None = None
    max_total_tokens: int = 0  # prompt + max_tokens, capped by the model's context

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
