"""Embedded mode: run a whole job in this process, no broker needed.

All shards go through one ShardDriver, so the engine stays full across shard
boundaries. The run holds the output's lease throughout (a second run on the output is
refused, naming this one). An earlier run's ``_SUCCESS`` is removed before any part is
replaced; the manifest is written at the end, ``_SUCCESS`` only when it says succeeded.
SIGTERM or SIGINT (``pipeline.stop_signals``) stops the run: every open shard's finished rows
are checkpointed, no manifest is written, the lease is released and ``RunInterrupted``
(exit 143 or 130) is raised; the next run resumes from the checkpoints.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from connectors import list_shards
from pipeline.engine_cache import get_engine, rebuild_engine
from pipeline.manifest import build_manifest, engine_delta, utc_now
from pipeline.metrics import step_observer
from pipeline.output_lease import holding_output
from pipeline.plan import JobPlan
from pipeline.progress import RunProgress
from pipeline.publish import begin_output, publish
from pipeline.shard_driver import ShardDriver
from pipeline.shard_engine import ShardEngine
from pipeline.shard_outcome import ShardOutcome, ShardState
from pipeline.stop_signals import StopRequest, interrupted, stoppable_run
from pipeline.summary import run_report, run_summary

log = logging.getLogger(__name__)


def run_embedded(
    plan: JobPlan,
    progress: bool = True,
    *,
    cross_shard: bool = True,
    engine: ShardEngine | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_progress: Callable[[ShardOutcome], None] | None = None,
    engine_factory: Callable[[], ShardEngine] | None = None,
) -> dict[str, Any]:
    """Process every shard of ``plan`` here and return the manifest (also written to the output).

    ``engine`` defaults to the process's cached engine for ``plan.engine_settings`` (the server's
    embedded runner passes its side of the engine it shares with the live routes, with an
    ``engine_factory`` for after a failed step; by default the cached engine is rebuilt);
    ``cross_shard=False`` drains the engine between shards (benchmarking only);
    ``on_progress`` also gets every shard's progress (the HTTP service's embedded runner).
    """
    with stoppable_run() as stop:
        return _run(plan, progress, cross_shard, engine, should_stop, on_progress, stop, engine_factory)


def _run(plan: JobPlan, progress: bool, cross_shard: bool, engine: ShardEngine | None,
         should_stop: Callable[[], bool] | None, on_progress: Callable[[ShardOutcome], None] | None,
         stop: StopRequest, engine_factory: Callable[[], ShardEngine] | None) -> dict[str, Any]:
    started_at, t0 = utc_now(), time.perf_counter()
    shards = list_shards(
        plan.input_url, format=plan.input_format, storage_options=plan.storage_options,
        split_row_groups=plan.split_row_groups,
    )
    with holding_output(plan):
        begin_output(plan)
        engine = engine or get_engine(plan.engine_settings)
        before = engine.stats()
        driver = ShardDriver(
            engine, plan, cross_shard=cross_shard,
            should_stop=lambda: stop.requested or (should_stop is not None and should_stop()),
            engine_factory=engine_factory or (lambda: rebuild_engine(plan.engine_settings)),
            on_step=step_observer(plan),
            hand_back=lambda: stop.requested,  # a signal: checkpoint the open shards, as a draining worker does
        )
        driver.stop_poll.interval_s = 0.0  # a flag and an Event: cheap to ask at every step
        outcomes: list[ShardOutcome] = []
        with RunProgress(len(shards), engine, enabled=progress) as bar:
            driver.on_progress = bar if on_progress is None else (lambda p: (bar(p), on_progress(p)))
            for outcome in driver.run(shards):
                if outcome.state == ShardState.FAILED:
                    log.warning("shard %d (%s) failed: %s", outcome.index, outcome.url, outcome.reason)
                outcomes.append(outcome)
        stopped = sum(o.state == ShardState.CANCELLED for o in outcomes)
        if stop.requested and stopped:  # (a signal after the last shard finished lets the run complete)
            kept = ("their finished rows checkpointed" if plan.checkpoints
                    else "checkpoints are off: their finished rows are lost")
            exc = interrupted(stop, f"run {plan.job_id} stopped {stopped} unfinished shards ({kept}) and wrote "
                                    "no manifest; run it again to resume")
            log.warning("%s", exc)
            raise exc
        elapsed = time.perf_counter() - t0
        stats = engine_delta(before, driver.engine.stats())
        manifest = build_manifest(
            plan, outcomes, mode="embedded", started_at=started_at, elapsed_s=elapsed, engine_stats=stats,
            summary=run_summary(plan, outcomes),
        )
        report = run_report(plan, manifest)
        if report:
            manifest["report"] = report
        publish(plan, manifest, outcomes)
    return manifest
