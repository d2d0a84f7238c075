"""The ``tokenmill`` commands that start a process: a fleet worker, beat, the benchmark (the server:
``cli.serve``).

They are plain functions here; ``cli.app`` adds them to the app with ``register``. The Celery app
reads ``$TOKENMILL_BROKER_URL`` once, when it is imported, so what reaches it is imported inside
each command, after ``use_broker``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from cli.serve import serve
from cli.support import (
    SPEC_EXIT,
    BrokerOption,
    OldQueueOption,
    QueueOption,
    fail,
    load_spec,
    setup_logging,
    use_broker,
)


def register(app: typer.Typer) -> None:
    """Adds worker, beat, serve and bench to ``app``, in that order (the order of ``--help``)."""
    app.command()(worker)
    app.command()(beat)
    app.command()(serve)
    app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(bench)


def worker(
    broker: BrokerOption = None,
    queue: Annotated[str | None, typer.Option("--queue", "-Q", help="queues to consume, comma-separated "
                                              "(default $TOKENMILL_QUEUE or 'tokenmill')")] = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", help="shard tasks held at once (threads pool)")
    ] = 2,
    pool: Annotated[
        str, typer.Option("--pool", help="threads: next shard admitted while one tails; solo: one at a time")
    ] = "threads",
    loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "INFO",
    hostname: Annotated[str | None, typer.Option("--hostname", "-n")] = None,
    grace_period: Annotated[
        float | None,
        typer.Option("--grace-period", help="on SIGTERM, seconds held shards may finish before they are "
                     "handed back to the broker (default $TOKENMILL_GRACE_PERIOD or 30)"),
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option("--metrics-port", help="serve Prometheus metrics at http://HOST:PORT/metrics")
    ] = None,
    metrics_host: Annotated[str, typer.Option("--metrics-host", help="address the metrics server binds")] = "0.0.0.0",
    old_queue: OldQueueOption = None,
) -> None:
    """Start a fleet worker (blocks); it also runs the enqueue task of 'tokenmill beat'."""
    queues = queue or old_queue
    use_broker(broker)
    # lazy: the Celery app reads the broker set just above
    import jobs.scheduled  # noqa: F401  (registers the scheduled-job task on the app)
    from pipeline.metrics import serve_metrics
    from pipeline.worker import start_worker

    if metrics_port is not None:
        serve_metrics(metrics_port, metrics_host)

    start_worker(queues.split(",") if queues else None, concurrency, pool, loglevel, hostname,
                 grace_period=grace_period)


def beat(
    jobs_dir: Annotated[Path, typer.Option("--jobs", help="folder of job specs; those with a schedule are served")],
    broker: BrokerOption = None,
    queue: QueueOption = None,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "INFO",
    old_queue: OldQueueOption = None,
) -> None:
    """Run Celery beat: enqueue every spec in --jobs that has a 'schedule' each time it is due."""
    queue = queue or old_queue
    use_broker(broker)
    if queue:
        os.environ["TOKENMILL_QUEUE"] = queue
    setup_logging(loglevel.upper())
    from connectors import CredentialError  # lazy: pyarrow and fsspec take most of a second
    from jobs.scheduled import run_beat, spec_files  # lazy: the Celery app reads the broker set above

    if not jobs_dir.is_dir():
        fail(f"--jobs {jobs_dir}: not a folder", SPEC_EXIT)
    specs = {path: load_spec(path, name_file=True) for path in spec_files(jobs_dir)}
    specs = {path: spec for path, spec in specs.items() if spec.schedule}
    if not specs:
        fail(f"no spec with a schedule in {jobs_dir}", SPEC_EXIT)
    for path, spec in specs.items():
        typer.echo(f"beat: {spec.name} ({spec.schedule}) from {path}", err=True)
    try:
        run_beat(jobs_dir, broker, loglevel.upper(), specs=specs)
    except CredentialError as exc:
        fail(f"spec error: {exc}", SPEC_EXIT)


def _bench_script() -> Path:
    return Path(__file__).resolve().parent.parent / "bench" / "bench_engine.py"


def bench(ctx: typer.Context) -> None:
    """The engine benchmark (bench/bench_engine.py); extra arguments are passed to it."""
    script = _bench_script()
    if not script.is_file():
        fail("the benchmark lives in bench/bench_engine.py of a source checkout: run `make bench` there")
    spec = importlib.util.spec_from_file_location("tokenmill_bench_engine", script)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(script.parent))  # the script imports its neighbours (workload.py)
    spec.loader.exec_module(module)
    module.main(list(ctx.args))
