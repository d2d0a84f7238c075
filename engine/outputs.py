"""What the engine hands back for a request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestMetrics:
    num_cached_prompt_tokens: int = 0
    num_preemptions: int = 0
    first_scheduled_step: int | None = None
    finished_step: int | None = None


@dataclass
class Logprob:
    """One token's log-probability at one position, as vLLM names it.

    ``rank`` is 1-based among the whole vocabulary (1 = most likely). The value is the
    log-softmax of the model's raw float32 logits, before temperature, top-k and top-p; for
    structured output, after the grammar mask (as vLLM does).
    """

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One position: token id -> Logprob, holding the sampled (or actual prompt) token plus the top-k.
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    """One of the ``n`` samples of a request."""

    index: int
    token_ids: list[int]
    text: str
    finish_reason: str | None = None  # "stop" | "length" | "error" | "abort"
    logprobs: list[PositionLogprobs] | None = None  # one entry per generated token
    cumulative_logprob: float | None = None  # sum of the sampled tokens' logprobs
    # beam search only: cumulative_logprob / len(token_ids) ** length_penalty, what ranks the beams
    score: float | None = None


@dataclass
class RequestOutput:
    """The result of one request (one prompt).

    ``outputs`` holds the ``n`` samples (always at least one). ``token_ids``, ``text``,
    ``finish_reason``, ``logprobs`` and ``cumulative_logprob`` mirror ``outputs[0]`` so code
    written for single-sample requests keeps working. ``prompt_logprobs`` has one entry per
    prompt token; the first, and any before ``prompt_logprobs_start``, are None.
    """

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None = None  # "stop" | "length" | "error" | "abort"
    error: str | None = None
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    outputs: list[CompletionOutput] = field(default_factory=list)
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    logprobs: list[PositionLogprobs] | None = None
    cumulative_logprob: float | None = None
    embedding: Any = None  # an embedding request's vector: a float32 numpy array (no tokens, no text)

    def __post_init__(self) -> None:
        if not self.outputs:
            self.outputs = [
                CompletionOutput(
                    0, self.token_ids, self.text, self.finish_reason, self.logprobs, self.cumulative_logprob
                )
            ]

    @classmethod
    def from_completions(
        cls, request_id: str, prompt_token_ids: list[int], outputs: list[CompletionOutput], **kwargs
    ) -> RequestOutput:
        """Build the output of a finished request; the single-sample fields mirror ``outputs[0]``."""
        first = outputs[0]
        return cls(
            request_id, prompt_token_ids, first.token_ids, first.text, True, first.finish_reason,
            outputs=outputs, logprobs=first.logprobs, cumulative_logprob=first.cumulative_logprob, **kwargs,
        )
