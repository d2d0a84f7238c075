"""What the engine hands back for a request."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    num_cached_prompt_tokens: int = 0
    num_preemptions: int = 0
    first_scheduled_step: int | None = None
    finished_step: int | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None = None  # "stop" | "length" | "error" | "abort"
    error: str | None = None
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
