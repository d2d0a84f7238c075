"""What a shard driver tells its caller: each shard's progress while it runs, and its outcome
(with the engine's counters) when it ends. A failing progress callback (a display, Redis)
is logged and never fails a shard."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from connectors import ShardRef
from pipeline.shard_engine import ShardEngine
from pipeline.shard_opening import OpenShard
from pipeline.shard_outcome import ShardCounts, ShardOutcome, ShardState

log = logging.getLogger(__name__)

_ENGINE_STATS = ("kv_peak_usage", "prefix_cache_hit_tokens", "mean_running_seqs", "preemptions", "steps")

ProgressCallback = Callable[[ShardOutcome], None]


class ShardReports:
    """The driver's reports to ``on_progress`` (None: nobody listens), signed by ``worker``."""

    def __init__(self, on_progress: ProgressCallback | None, worker: str) -> None:
        self.on_progress, self.worker = on_progress, worker

    def outcome(
        self, engine: ShardEngine, ref: ShardRef, state: ShardState, started: float,
        counts: ShardCounts | None = None, reason: str | None = None, transient: bool = False,
        shard: OpenShard | None = None, part_commit: str | None = None,
    ) -> ShardOutcome:
        """A shard's final outcome, with the engine's counters; reported to the progress callback too."""
        try:
            s = engine.stats()
            stats = {k: s[k] for k in _ENGINE_STATS}
        except Exception:  # a broken engine must not hide the shard's outcome
            stats = {}
        outcome = ShardOutcome(
            ref.index, ref.url, state, replace(counts) if counts else ShardCounts(), reason=reason,
            transient=transient, seconds=round(time.perf_counter() - started, 3), worker=self.worker,
            part=ref.part_id, engine_counters=stats, part_commit=part_commit,
        )
        if shard is not None:
            outcome.part_commit = shard.sink.commit_id
            outcome.rows_resumed, outcome.rows_reused = shard.sink.resumed, shard.rows_reused
            outcome.rows_shared, outcome.output_tokens_computed = shard.rows_shared, shard.output_tokens_computed
        self.notify(outcome)
        return outcome

    def notify(self, progress: ShardOutcome) -> None:
        if self.on_progress is None:
            return
        try:
            self.on_progress(progress)
        except Exception as exc:  # progress display/reporting must never fail a shard
            log.warning("progress callback failed: %s", exc)
