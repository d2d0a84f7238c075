"""Prometheus metrics of a worker's engine and shards (``tokenmill worker --metrics-port N``).

Counters follow the rows and tokens a shard reports as it goes, and are trued up to the
shard's final ShardOutcome when it ends, so at the end of a job they equal the manifest's
totals. Engine gauges and the step histogram are fed after every engine step. Every
series is labelled with the job kind and model (the model's registry name, or the last
component of its path). The latest engine reading is also kept in ``snapshot()`` so the
progress a worker reports to Redis can carry KV use and the prefix-hit rate.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from pipeline.shard_outcome import ShardOutcome, ShardState

LABELS = ("kind", "model")

ROWS = Counter("tokenmill_rows", "Rows finished (with or without a row error)", LABELS)
ROW_ERRORS = Counter("tokenmill_row_errors", "Rows finished with an error", LABELS)
PROMPT_TOKENS = Counter("tokenmill_prompt_tokens", "Prompt tokens of finished rows", LABELS)
CACHED_PROMPT_TOKENS = Counter(
    "tokenmill_cached_prompt_tokens", "Prompt tokens of finished rows served from the prefix cache", LABELS
)
OUTPUT_TOKENS = Counter("tokenmill_output_tokens", "Generated tokens of finished rows", LABELS)
PREFIX_QUERIES = Counter("tokenmill_prefix_cache_queries", "Prompt tokens looked up in the prefix cache", LABELS)
PREFIX_HITS = Counter("tokenmill_prefix_cache_hits", "Prompt tokens found in the prefix cache", LABELS)
KV_BLOCKS_USED = Gauge("tokenmill_kv_blocks_used", "KV-cache blocks in use", LABELS)
KV_BLOCKS_TOTAL = Gauge("tokenmill_kv_blocks", "KV-cache blocks in the pool", LABELS)
RUNNING = Gauge("tokenmill_running_sequences", "Sequences in the running batch", LABELS)
WAITING = Gauge("tokenmill_waiting_sequences", "Sequences waiting for admission", LABELS)
STEP_SECONDS = Histogram(
    "tokenmill_engine_step_duration_seconds", "Wall time of one engine step", LABELS,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
SHARD_SECONDS = Histogram(
    "tokenmill_shard_duration_seconds", "Wall time of one shard, by outcome", (*LABELS, "outcome"),
    buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400),
)
SHARDS = Counter("tokenmill_shards", "Shard runs finished, by outcome (done, skipped, failed, cancelled, retrying)",
                 (*LABELS, "outcome"))

_lock = threading.Lock()
_snapshot: dict[str, Any] = {}
_gauge_labels: tuple[str, str] | None = None


def model_label(engine_settings: dict[str, Any]) -> str:
    model = str(engine_settings.get("model") or "")
    return PurePath(model).name if "/" in model else model


def plan_labels(plan: Any) -> tuple[str, str]:
    return str(plan.kind), model_label(plan.engine_settings)


def snapshot() -> dict[str, Any]:
    """The last engine reading: kv_usage (0..1), prefix_hit_rate (0..1, cumulative), running, waiting."""
    with _lock:
        return dict(_snapshot)


def step_observer(plan: Any) -> Callable[[Any, float], None]:
    """A ShardDriver ``on_step(engine, seconds)`` callback for this plan's labels."""
    labels = plan_labels(plan)
    last = {"engine": None, "queries": 0, "hits": 0}

    def observe(engine: Any, seconds: float) -> None:
        global _gauge_labels
        scheduler, bm = engine.scheduler, engine.block_manager
        if last["engine"] is not engine:  # a rebuilt engine starts its counts again
            last.update(engine=engine, queries=scheduler.prefix_query_tokens, hits=scheduler.prefix_hit_tokens)
        queries, hits = scheduler.prefix_query_tokens, scheduler.prefix_hit_tokens
        PREFIX_QUERIES.labels(*labels).inc(max(0, queries - last["queries"]))
        PREFIX_HITS.labels(*labels).inc(max(0, hits - last["hits"]))
        last.update(queries=queries, hits=hits)
        STEP_SECONDS.labels(*labels).observe(seconds)
        with _lock:
            if _gauge_labels != labels:  # one plan at a time: drop the previous plan's gauges
                for gauge in (KV_BLOCKS_USED, KV_BLOCKS_TOTAL, RUNNING, WAITING):
                    gauge.clear()
                _gauge_labels = labels
            used, total = bm.num_used_blocks, engine.stats_tracker.num_blocks
            running, waiting = len(scheduler.running), len(scheduler.waiting)
            KV_BLOCKS_USED.labels(*labels).set(used)
            KV_BLOCKS_TOTAL.labels(*labels).set(total)
            RUNNING.labels(*labels).set(running)
            WAITING.labels(*labels).set(waiting)
            _snapshot.update(
                kv_usage=round(used / total, 4) if total else 0.0,
                prefix_hit_rate=round(hits / queries, 4) if queries else 0.0,
                running=running, waiting=waiting, at=time.time(),
            )

    return observe


class ShardMeter:
    """Counts one shard's rows and tokens as its progress arrives, then trues them up to its result."""

    _FIELDS = (("rows", ROWS), ("errors", ROW_ERRORS), ("prompt_tokens", PROMPT_TOKENS),
               ("output_tokens", OUTPUT_TOKENS), ("cached_prompt_tokens", CACHED_PROMPT_TOKENS))

    def __init__(self, plan: Any) -> None:
        self.labels = plan_labels(plan)
        self.counted = {name: 0 for name, _ in self._FIELDS}

    def _add(self, name: str, counter: Counter, value: int) -> None:
        delta = int(value or 0) - self.counted[name]
        if delta > 0:
            counter.labels(*self.labels).inc(delta)
            self.counted[name] += delta

    def progress(self, p: ShardOutcome) -> None:
        if p.state == ShardState.SKIPPED:  # rows an earlier run produced: not this worker's work
            return
        for name, counter in self._FIELDS:
            self._add(name, counter, getattr(p.counts, name))

    def finish(self, result: ShardOutcome, retrying: bool = False) -> None:
        """``retrying``: a transient failure the task runs again (outcome ``retrying``, not ``failed``)."""
        outcome = ShardState.RETRYING.value if retrying else result.state.value
        if outcome != ShardState.SKIPPED:
            for name, counter in self._FIELDS:
                self._add(name, counter, getattr(result.counts, name))
        SHARDS.labels(*self.labels, outcome).inc()
        SHARD_SECONDS.labels(*self.labels, outcome).observe(float(result.seconds or 0.0))


def serve_metrics(port: int, addr: str = "0.0.0.0") -> None:
    """Expose this process's metrics at http://addr:port/metrics (a daemon thread)."""
    from prometheus_client import start_http_server

    start_http_server(port, addr=addr)
