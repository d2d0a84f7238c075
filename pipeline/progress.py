"""Live progress of an embedded run: rows, shards, output tokens/s and KV-cache use."""

from __future__ import annotations

import time
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from pipeline.shard_outcome import FINAL_SHARD_STATES, ShardOutcome, ShardState


class RunProgress:
    """A rich progress bar over rows, fed by ShardDriver's progress callback.

    It counts rows, not shards, so one large file moves the bar as its rows finish. The total
    is not known before the files are read, so the bar pulses and counts. Tokens/s is the
    engine's own count of tokens generated since the run began: rows taken from a checkpoint,
    a previous part or a part already current add rows but no speed.
    """

    def __init__(self, total_shards: int, engine: Any, enabled: bool = True) -> None:
        self.engine, self.total_shards = engine, total_shards
        self.rows: dict[int, int] = {}
        self.skipped_rows: dict[int, int] = {}
        self.finished: set[int] = set()
        self.started = time.perf_counter()
        self._tokens_at_start = self._stats().get("decode_tokens", 0)
        self._kv, self._tokens, self._stats_at = 0.0, 0, 0.0
        self.bar = Progress(
            TextColumn("[bold]rows"),
            BarColumn(),
            TextColumn("{task.completed:,.0f}"),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            disable=not enabled,
            transient=False,
        )
        self.task = self.bar.add_task("rows", total=None, info="")

    def __enter__(self) -> RunProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(*exc)

    def _stats(self) -> dict[str, Any]:
        return self.engine.stats()

    def _refresh(self) -> None:
        """KV use and tokens generated, read at most twice a second."""
        now = time.perf_counter()
        if now - self._stats_at > 0.5:
            self._stats_at = now
            s = self._stats()
            self._kv = s["kv_blocks_used_now"] / s["kv_blocks_total"] if s.get("kv_blocks_total") else 0.0
            self._tokens = s.get("decode_tokens", 0) - self._tokens_at_start

    def __call__(self, p: ShardOutcome) -> None:
        self.rows[p.index] = p.counts.rows
        if p.state == ShardState.SKIPPED:
            self.skipped_rows[p.index] = p.counts.rows
        if p.state in FINAL_SHARD_STATES:
            self.finished.add(p.index)
        self._refresh()
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        skipped = sum(self.skipped_rows.values())
        info = (
            f"{len(self.finished)}/{self.total_shards} shards{f' · {skipped} rows already done' if skipped else ''} · "
            f"{self._tokens / elapsed:.0f} tok/s · KV {self._kv:.0%}"
        )
        self.bar.update(self.task, completed=sum(self.rows.values()), info=info)
