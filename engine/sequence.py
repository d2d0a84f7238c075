"""A request's whole state as the engine sees it: tokens, progress, KV block table, status."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    # Async scheduling: its last token is in flight and ends it by length, so it has left the
    # running set and given back its blocks; the token is applied when its step lands.
    DRAINING = "draining"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One sample of a request (a request with ``n`` samples has ``n`` of these, sharing the
    ``request_id``). The scheduler and block manager work only on these fields; sequences
    compare by identity.

    ``num_computed_tokens`` counts tokens whose keys/values are in the KV cache; the
    tokens from there to ``len(token_ids)`` still have to be fed to the model.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    # bumped by the block manager on any change to block_table but an append (BlockTableRows)
    block_table_version: int = 0
    table_row: int = -1  # this sequence's row of the model runner's BlockTableRows, once it has one
    block_hashes: list[bytes] = field(default_factory=list)
    num_registered_blocks: int = 0  # leading blocks of block_table already offered to the prefix cache
    # set by the block manager: the tokens it may have computed before allocate_slots has work to
    # do again (a new block, a block to publish, a window to slide); 0: call it every step
    slots_ready_until: int = 0
    # 1 while the last entry of token_ids is a placeholder for a token the device is still sampling
    # (async scheduling); the engine writes the real token there before anything reads it.
    num_pending_tokens: int = 0
    released_blocks: int = 0  # leading block-table entries given back (outside the sliding window)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    stop_text_end: int | None = None  # where a stop string starts in the output text
    incremental_text: Any = None  # engine.detokenizer.IncrementalText, once stop strings are searched
    num_cached_prompt_tokens: int = 0
    num_preemptions: int = 0
    first_scheduled_step: int | None = None
    finished_step: int | None = None
    max_total_tokens: int = 0  # prompt + max_tokens, capped by the model's context
    # set by StopConditions.attach: the token ids that end it when only they and its length can
    # (EOS unless ignored); None: every token goes through StopConditions.finish_reason
    ending_token_ids: frozenset[int] | None = None
    sample_index: int = 0  # which of the request's n samples
    priority: int = 0  # the request's place in the scheduler's queues: lower goes first (vLLM's sense)
    pending_forks: int = 0  # samples still to be forked from this one after its prompt is computed
    logprobs: list[Any] | None = None  # per generated token, when the request asks for logprobs
    cumulative_logprob: float = 0.0
    seed: int | None = None  # a sampling (non-greedy) sequence's seed: its draws hash (seed, position)
    matcher: Any = None  # grammar matcher of a structured-output sequence
    pooling: Any = None  # engine.pooling.PoolingParams of an embedding request (it never samples)
    pooled: Any = None  # its pooled state so far (mean pooling's running sum)

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
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def needs_prompt_logits(self) -> bool:
        """Its prompt logprobs are still to be computed (the first pass over the prompt)."""
        return self.params.prompt_logprobs is not None and self.num_output_tokens == 0

    @property
    def max_cached_tokens(self) -> int:
        """How many leading tokens the prefix cache may serve. The last token is always
        computed (its logits sample the next one), and so is every prompt position whose
        logits give a prompt logprob that is asked for."""
        limit = self.num_tokens - 1
        if self.pooling is not None and self.pooling.pooling != "last":
            return 0  # mean and cls pooling read hidden states from position 0 on
        if self.needs_prompt_logits:
            limit = min(limit, self.params.prompt_logprobs_start - 1)
        return limit

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
