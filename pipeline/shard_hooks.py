"""What a shard driver's caller hands it besides the engine and the plan, as one object: where
reports go, when to stop, whether a stop hands shards back, how to rebuild a broken engine, and
who watches each step."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.shard_engine import ShardEngine
from pipeline.shard_reports import ProgressCallback, ShardReports
from pipeline.stop_poll import StopPoll


@dataclass
class ShardHooks:
    reports: ShardReports  # progress and outcomes, signed by the worker
    stop_poll: StopPoll  # should_stop may ask Redis: not at every step
    hand_back: Callable[[], bool] | None = None  # asked on a stop: True checkpoints and hands shards back
    engine_factory: Callable[[], ShardEngine] | None = None  # a fresh engine after a step fault
    on_step: Callable[[ShardEngine, float], None] | None = None  # metrics: the engine and each step's seconds

    @classmethod
    def build(
        cls, *, on_progress: ProgressCallback | None = None, should_stop: Callable[[], bool] | None = None,
        worker: str | None = None, hand_back: Callable[[], bool] | None = None,
        engine_factory: Callable[[], ShardEngine] | None = None,
        on_step: Callable[[ShardEngine, float], None] | None = None,
    ) -> ShardHooks:
        """The hooks of ``ShardDriver``'s keyword arguments (``worker`` None: host:pid)."""
        reports = ShardReports(on_progress, worker or f"{socket.gethostname()}:{os.getpid()}")
        return cls(reports, StopPoll(should_stop), hand_back, engine_factory, on_step)

    def handing_back(self) -> bool:
        return self.hand_back is not None and self.hand_back()
