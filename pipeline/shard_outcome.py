"""How a shard stands or ended: the one typed record from the driver to the manifest.

The driver reports a running shard's counters and its end with the same ``ShardOutcome``;
the engine thread, the task, the progress bar, the metrics and the manifest all read it.
It becomes a dict only where it leaves the process: ``to_result_dict`` is the Celery task's
result and the manifest's shard entry (``status``, ``rows``), ``to_state_dict`` the live state
a worker writes to Redis (``state``, ``rows_done``). Those two formats are public (job
manifests and ``job_status`` output), so their names stay; they are spelled here only.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from connectors.parquet_sink import part_id_of
from connectors.redaction import redact

if TYPE_CHECKING:
    from pipeline.result_row import ResultRow


class ShardState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"  # part written
    SKIPPED = "skipped"  # part already current
    FAILED = "failed"  # shard unreadable or part not written (no part file)
    CANCELLED = "cancelled"  # the job was cancelled before or while it ran
    RETRYING = "retrying"  # failed transiently and its task runs again: not final


FINAL_SHARD_STATES = (ShardState.DONE, ShardState.SKIPPED, ShardState.FAILED, ShardState.CANCELLED)
# The states whose shard has its part in the output (the manifest's ``parts``).
PART_STATES = (ShardState.DONE, ShardState.SKIPPED)


def entry_has_part(entry: dict[str, Any]) -> bool:
    """Whether a manifest shard entry (a result dict) names a part that is in the output."""
    return entry.get("status") in PART_STATES and bool(entry.get("part"))


# A manifest shard entry names its part by id (``part``) and file (``part_file``); manifests
# written before ``part_file`` existed held the file name in ``part``. Read entries through these.
def entry_part_id(entry: dict[str, Any]) -> str | None:
    part = entry.get("part")
    return part_id_of(part) if part and "part_file" not in entry else part


def entry_part_file(entry: dict[str, Any]) -> str | None:
    return entry["part_file"] if "part_file" in entry else entry.get("part")


@dataclass
class ShardCounts:
    """Rows written to the shard's part and their tokens; also kept in the part's footer."""

    rows: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_prompt_tokens: int = 0

    def add_row(self, row: ResultRow) -> None:
        self.rows += 1
        self.errors += row.error is not None
        self.prompt_tokens += row.prompt_tokens
        self.output_tokens += row.output_tokens
        self.cached_prompt_tokens += row.cached_prompt_tokens

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], rows_key: str = "rows") -> ShardCounts:
        """Counts from a result dict (``rows``), a state dict (``rows_done``) or a footer; absent ones are 0."""
        return cls(
            rows=data.get(rows_key) or 0, errors=data.get("errors") or 0,
            prompt_tokens=data.get("prompt_tokens") or 0, output_tokens=data.get("output_tokens") or 0,
            cached_prompt_tokens=data.get("cached_prompt_tokens") or 0,
        )


@dataclass
class ShardOutcome:
    """A shard's state and counts: while it runs (``RUNNING``, counts growing) and when it ends."""

    index: int
    url: str
    state: ShardState
    counts: ShardCounts = field(default_factory=ShardCounts)
    reason: str | None = None
    transient: bool = False  # failed on an error a later retry may not hit (network, 5xx)
    seconds: float = 0.0
    worker: str | None = None
    part: str | None = None  # the shard's part id (connectors.ShardRef.part_id)
    part_commit: str | None = None  # the commit id in its part's footer: which write of the part
    engine_counters: dict[str, Any] = field(default_factory=dict)  # the worker engine's counters at the end
    started_at: float = field(default_factory=time.time)
    # Of its rows, those not computed: taken from an earlier attempt's checkpoint, from the
    # previous part (unchanged content key), or from an identical row of the same run.
    rows_resumed: int = 0
    rows_reused: int = 0
    rows_shared: int = 0
    # Output tokens of the rows the engine computed in this attempt (None: a result of a worker
    # before issue 41, which did not count them): what a job's tokens/s is made of.
    output_tokens_computed: int | None = None

    @property
    def has_part(self) -> bool:
        """Its part is in the output: written now or already current."""
        return self.state in PART_STATES and bool(self.part)

    # ---- the Celery result / manifest form ---------------------------------------------------
    def to_result_dict(self) -> dict[str, Any]:
        c = self.counts
        return {
            "index": self.index, "url": self.url, "status": self.state.value, "rows": c.rows, "errors": c.errors,
            "reason": self.reason, "prompt_tokens": c.prompt_tokens, "output_tokens": c.output_tokens,
            "cached_prompt_tokens": c.cached_prompt_tokens, "seconds": self.seconds, "worker": self.worker,
            "part": self.part, "part_commit": self.part_commit, "transient": self.transient,
            "engine": dict(self.engine_counters),
            "rows_resumed": self.rows_resumed, "rows_reused": self.rows_reused, "rows_shared": self.rows_shared,
            "output_tokens_computed": self.output_tokens_computed,
        }

    @classmethod
    def from_result_dict(cls, data: dict[str, Any]) -> ShardOutcome:
        return cls(
            data["index"], data.get("url") or "", ShardState(data["status"]), ShardCounts.from_dict(data),
            reason=data.get("reason"), transient=bool(data.get("transient")), seconds=data.get("seconds") or 0.0,
            worker=data.get("worker"), part=data.get("part"), part_commit=data.get("part_commit"),
            engine_counters=dict(data.get("engine") or {}),
            rows_resumed=data.get("rows_resumed") or 0, rows_reused=data.get("rows_reused") or 0,
            rows_shared=data.get("rows_shared") or 0, output_tokens_computed=data.get("output_tokens_computed"),
        )

    # ---- the live-state (Redis) form ---------------------------------------------------------
    def to_state_dict(self) -> dict[str, Any]:
        """What a worker reports while the shard runs (the reporter adds who and when)."""
        c = self.counts
        return {
            "state": self.state.value, "url": self.url, "rows_done": c.rows, "errors": c.errors,
            "output_tokens": c.output_tokens, "prompt_tokens": c.prompt_tokens, "reason": self.reason,
            "cached_prompt_tokens": c.cached_prompt_tokens, "rows_resumed": self.rows_resumed,
            "rows_reused": self.rows_reused, "rows_shared": self.rows_shared, "part_commit": self.part_commit,
            "output_tokens_computed": self.output_tokens_computed,
        }

    @staticmethod
    def queued_state_dict(url: str, **extra: Any) -> dict[str, Any]:
        """The live state of a shard not started (again) yet: at submit, or handed back."""
        return {"state": ShardState.QUEUED.value, "url": url, **extra}

    @staticmethod
    def is_final_state(data: dict[str, Any]) -> bool:
        """Whether a reported live state is a shard's end (``retrying`` is not)."""
        return data.get("state") in FINAL_SHARD_STATES

    def __post_init__(self) -> None:
        if self.reason:  # the reason goes to Redis, the manifest and status: no credential in it
            self.reason = redact(self.reason)

    @classmethod
    def from_state_dict(
        cls, index: int, data: dict[str, Any], failed_reason: str | None = None, part: str | None = None
    ) -> ShardOutcome:
        """The outcome a worker last reported for the shard; anything not final counts as failed."""
        state = ShardState(data["state"]) if cls.is_final_state(data) else ShardState.FAILED
        reason = data.get("reason") or (failed_reason if state == ShardState.FAILED else None)
        return cls(
            index, data.get("url", ""), state, ShardCounts.from_dict(data, rows_key="rows_done"), reason=reason,
            worker=data.get("worker"), part=data.get("part") or part, part_commit=data.get("part_commit"),
            rows_resumed=data.get("rows_resumed") or 0,
            rows_reused=data.get("rows_reused") or 0, rows_shared=data.get("rows_shared") or 0,
            output_tokens_computed=data.get("output_tokens_computed"),
        )

