"""The ``tokenmill`` commands that start a process: a fleet worker, beat, the server, the benchmark.

They are plain functions here; ``jobs.cli`` adds them to the app with ``register``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from jobs.cli_support import (
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
    import jobs.scheduled  # noqa: F401  (registers the scheduled-job task on the app)
    from pipeline.worker import start_worker

    if metrics_port is not None:
        from pipeline.metrics import serve_metrics

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
    from jobs.scheduled import run_beat, spec_files

    if not jobs_dir.is_dir():
        fail(f"--jobs {jobs_dir}: not a folder", SPEC_EXIT)
    specs = {path: load_spec(path, name_file=True) for path in spec_files(jobs_dir)}
    specs = {path: spec for path, spec in specs.items() if spec.schedule}
    if not specs:
        fail(f"no spec with a schedule in {jobs_dir}", SPEC_EXIT)
    for path, spec in specs.items():
        typer.echo(f"beat: {spec.name} ({spec.schedule}) from {path}", err=True)
    from connectors import CredentialError

    try:
        run_beat(jobs_dir, broker, loglevel.upper(), specs=specs)
    except CredentialError as exc:
        fail(f"spec error: {exc}", SPEC_EXIT)


def serve(
    storage: Annotated[str, typer.Option("--storage", help="fsspec URL for uploaded files, results and metadata")],
    broker: Annotated[
        str | None, typer.Option("--broker", "-b", help="the fleet's broker; none: jobs run in this process")
    ] = None,
    queue: QueueOption = None,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p")] = 8000,
    api_keys_file: Annotated[
        Path | None, typer.Option("--api-keys-file", help="one key per line, or TOML giving each key its "
                                   "own prefixes, variables and models (docs/tenants.md); also $TOKENMILL_API_KEYS")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="registered model name or local directory (default: the "
                                 "packaged default model)")
    ] = None,
    served_model_name: Annotated[
        str | None, typer.Option("--served-model-name", help="the name batch requests give as body.model")
    ] = None,
    engine_options: Annotated[
        str | None, typer.Option("--engine-options", help='JSON of more [model] fields, e.g. {"num_threads": 1}')
    ] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="for requests that set none")] = 256,
    max_upload_mb: Annotated[float, typer.Option("--max-upload-mb")] = 200.0,
    allow_env: Annotated[
        list[str] | None, typer.Option("--allow-env", help="variables specs may reference as ${env:NAME} "
                                       "credentials, fnmatch patterns like 'AWS_*' (repeat; default none)")
    ] = None,
    allow_profile: Annotated[
        list[str] | None, typer.Option("--allow-profile", help="storage profiles specs may name (repeat)")
    ] = None,
    allowed_url_prefix: Annotated[
        list[str] | None, typer.Option("--allowed-url-prefix", help="confine /v1/jobs input and output URLs to "
                                       "these prefixes; needed for local paths (repeat)")
    ] = None,
    old_queue: OldQueueOption = None,
) -> None:
    """Serve the OpenAI Files/Batches API, /v1/jobs, /metrics and the dashboard at / (blocks)."""
    queue = queue or old_queue
    setup_logging()
    use_broker(broker)
    from engine.model_registry import DEFAULT_MODEL
    from service.app import serve as run_server
    from service.settings import ServiceSettings, SettingsError, load_keys

    try:
        keys, key_scopes, shared = load_keys(os.environ.get("TOKENMILL_API_KEYS"), api_keys_file)
        options = json.loads(engine_options) if engine_options else {}
        if not isinstance(options, dict):
            raise SettingsError("--engine-options: expected a JSON object")
    except (SettingsError, ValueError) as exc:
        fail(f"serve: {exc}", SPEC_EXIT)
    settings = ServiceSettings(
        storage_url=storage, api_keys=keys, broker_url=broker, queue=queue,
        redis_key_prefix=os.environ.get("TOKENMILL_REDIS_KEY_PREFIX"), model=model or DEFAULT_MODEL,
        served_model_name=served_model_name, engine_options=options, default_max_tokens=max_tokens,
        max_upload_bytes=int(max_upload_mb * 1024 * 1024), allowed_env=list(allow_env or []),
        allowed_profiles=list(allow_profile or []), allowed_url_prefixes=list(allowed_url_prefix or []),
        key_scopes=key_scopes, shared=shared,
    )
    typer.echo(f"tokenmill serve: http://{host}:{port}/ ({'fleet ' + broker if broker else 'embedded runner'}, "
               f"model {settings.model_name}, storage {storage})", err=True)
    run_server(settings, host, port)


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
