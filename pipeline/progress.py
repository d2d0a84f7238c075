"""Live progress of an embedded run: shards, rows, output tokens/s and KV-cache use."""

from __future__ import annotations

import time
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pipeline.shard_processor import ShardProgress
from pipeline.shard_result import STATUSES as TERMINAL_STATES


class RunProgress:
    """A rich progress bar over shards, fed by ShardProcessor's progress callback."""

    def __init__(self, total_shards: int, engine: Any, enabled: bool = True) -> None:
        self.engine = engine
        self.rows: dict[int, int] = {}
        self.tokens: dict[int, int] = {}
        self.finished: set[int] = set()
        self.started = time.perf_counter()
        self._kv = 0.0
        self._kv_at = 0.0
        self.bar = Progress(
            TextColumn("[bold]shards"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            disable=not enabled,
            transient=False,
        )
        self.task = self.bar.add_task("shards", total=total_shards, info="")

    def __enter__(self) -> RunProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(*exc)

    def kv_usage(self) -> float:
        now = time.perf_counter()
        if now - self._kv_at > 0.5:
            self._kv_at = now
            s = self.engine.stats()
            self._kv = s["kv_blocks_used_now"] / s["kv_blocks_total"] if s["kv_blocks_total"] else 0.0
        return self._kv

    def __call__(self, p: ShardProgress) -> None:
        self.rows[p.index] = p.rows_done
        self.tokens[p.index] = p.output_tokens
        if p.state in TERMINAL_STATES:
            self.finished.add(p.index)
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        info = (
            f"{sum(self.rows.values())} rows · {sum(self.tokens.values()) / elapsed:.0f} tok/s · "
            f"KV {self.kv_usage():.0%}"
        )
        self.bar.update(self.task, completed=len(self.finished), info=info)
