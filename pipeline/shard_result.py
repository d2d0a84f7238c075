"""What processing one shard produced: the unit a Celery task returns and the manifest lists."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# done: part written; skipped: part already current; failed: shard unreadable or part not
# written (no part file); cancelled: the job was cancelled before or while it ran.
STATUSES = ("done", "skipped", "failed", "cancelled")
# A shard that failed on a transient error and whose task will run again: not final.
RETRYING = "retrying"


@dataclass
class ShardResult:
    index: int
    url: str
    status: str
    rows: int = 0
    errors: int = 0
    reason: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_prompt_tokens: int = 0
    seconds: float = 0.0
    worker: str | None = None
    part: str | None = None  # the shard's part id (connectors.ShardRef.part_id)
    transient: bool = False  # failed on an error a later retry may not hit (network, 5xx)
    engine: dict[str, Any] = field(default_factory=dict)  # the worker engine's counters at the end

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardResult:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
