"""The ``tokenmill`` command.

    tokenmill run JOB.toml                  embedded: this process, no broker
    tokenmill submit JOB.toml [--broker]    queue on the fleet, print the job id
    tokenmill status JOB_ID | JOB.toml      fleet state, or a spec's output state
    tokenmill cancel JOB_ID
    tokenmill worker [--broker] [--queues]  a fleet worker
    tokenmill beat --jobs DIR [--broker]    enqueue specs with a ``schedule`` when due
    tokenmill serve --storage URL [--broker] the OpenAI-compatible Batches API, job routes, dashboard
    tokenmill bench                         the engine benchmark

A broker given with ``--broker`` is exported as $TOKENMILL_BROKER_URL before anything
imports the Celery app, which reads it once. Spec problems exit with status 2 and one
``spec error: <field>: <message>`` line per problem.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.logging import RichHandler

from jobs.spec import JobSpec, SpecFileError
from jobs.spec_errors import format_errors
from pipeline.plan import JobPlan

app = typer.Typer(
    name="tokenmill", help="Batch LLM inference: run job specs embedded or on a Celery fleet.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
console = Console()
err = Console(stderr=True)

BrokerOption = Annotated[
    str | None, typer.Option("--broker", "-b", help="broker URL (default $TOKENMILL_BROKER_URL or local Redis)")
]
QueueOption = Annotated[
    str | None, typer.Option("--queue", "-q", help="queue name (default $TOKENMILL_QUEUE or 'tokenmill')")
]
SPEC_EXIT = 2
FAILED_EXIT = 1


def _fail(message: str, code: int = FAILED_EXIT) -> NoReturn:
    typer.echo(message, err=True)  # plain: one unwrapped line per problem
    raise typer.Exit(code)


def _logging(level: str = "WARNING") -> None:
    """Warnings (and beat's INFO) to stderr through rich, unless the host process set up logging."""
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(RichHandler(console=err, show_path=False))
        root.setLevel(level)


def load_spec(path: Path, name_file: bool = False) -> JobSpec:
    """The spec, or exit 2 printing each problem as ``spec error: [<file>: ]<field>: <message>``."""
    try:
        return JobSpec.from_file(path)
    except SpecFileError as exc:
        _fail(f"spec error: {exc}", SPEC_EXIT)
    except ValidationError as exc:
        where = f"{path}: " if name_file else ""
        _fail("\n".join(f"spec error: {where}{line}" for line in format_errors(exc, JobSpec)), SPEC_EXIT)


def _plan_or_exit(spec: JobSpec, job_id: str | None) -> JobPlan:
    """``to_plan`` may read the input (openai_batch); input problems exit 2 with the reason."""
    from connectors import StorageError

    try:
        return spec.to_plan(job_id)
    except StorageError as exc:
        _fail(f"input error: {exc}")
    except ValueError as exc:
        _fail(f"spec error: {exc}", SPEC_EXIT)


def _use_broker(broker: str | None) -> None:
    """A ``--broker`` on Redis also carries results and job state (its database 1) unless a
    result backend is configured: otherwise ``submit`` against a remote fleet would write job
    state to a local Redis that its workers never see."""
    if broker:
        os.environ["TOKENMILL_BROKER_URL"] = broker
        if broker.startswith(("redis://", "rediss://")) and not os.environ.get("TOKENMILL_RESULT_BACKEND"):
            os.environ["TOKENMILL_RESULT_BACKEND"] = redis_database(broker, 1)


def redis_database(url: str, db: int) -> str:
    """``url`` with its database number replaced (``redis://h:6379/0`` -> ``redis://h:6379/1``)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


@app.command()
def run(
    spec_path: Annotated[Path, typer.Argument(metavar="JOB.toml", help="job spec (TOML or YAML)")],
    show: Annotated[int, typer.Option("--show", help="sample outputs to print at the end")] = 3,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="live progress bar")] = True,
    job_id: Annotated[str | None, typer.Option("--job-id", help="default: <name>-<random>")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the manifest as JSON instead")] = False,
) -> None:
    """Run a job here, embedded (no broker): progress, then a summary and sample outputs."""
    _logging()
    spec = load_spec(spec_path)
    plan = _plan_or_exit(spec, job_id)
    from connectors import StorageError
    from pipeline.job_runner import run_embedded

    try:
        manifest = run_embedded(plan, progress=progress and not as_json)
    except StorageError as exc:
        _fail(f"input error: {exc}")
    extra = {f"report ({k})": v for k, v in (manifest.get("report") or {}).items()}
    if as_json:
        typer.echo(json.dumps(manifest, indent=2, default=str))
    else:
        from jobs.console import print_run, read_samples

        samples = read_samples(manifest, plan.output_options, show) if show > 0 else []
        print_run(console, manifest, samples, extra)
    if manifest["status"] != "succeeded":
        raise typer.Exit(FAILED_EXIT)


@app.command()
def submit(
    spec_path: Annotated[Path, typer.Argument(metavar="JOB.toml", help="job spec (TOML or YAML)")],
    broker: BrokerOption = None,
    queue: QueueOption = None,
    job_id: Annotated[str | None, typer.Option("--job-id", help="default: <name>-<random>")] = None,
) -> None:
    """Queue a job on the fleet (one task per shard) and print its job id."""
    _logging()
    _use_broker(broker)
    spec = load_spec(spec_path)
    plan = _plan_or_exit(spec, job_id)
    from connectors import CredentialError, StorageError
    from pipeline.fleet import submit_job

    try:
        print(submit_job(plan, broker, queue=queue))
    except StorageError as exc:
        _fail(f"input error: {exc}")
    except CredentialError as exc:
        _fail(f"spec error: {exc}", SPEC_EXIT)


@app.command()
def status(
    job: Annotated[str, typer.Argument(metavar="JOB_ID|JOB.toml", help="a fleet job id, or a spec to read its output")],
    broker: BrokerOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the status as JSON")] = False,
) -> None:
    """Per-shard state and progress of a job (live from Redis; for a spec, from its output)."""
    _use_broker(broker)
    from pipeline.fleet import job_status

    try:
        if Path(job).suffix.lower() in (".toml", ".yaml", ".yml") and Path(job).is_file():
            state = job_status(_plan_or_exit(load_spec(Path(job)), "status"))
        else:
            state = job_status(job)
    except KeyError as exc:
        _fail(str(exc.args[0]) if exc.args else f"unknown job {job!r}")
    if as_json:
        typer.echo(json.dumps(state, indent=2, default=str))
    else:
        from jobs.console import status_table

        console.print(status_table(state))


@app.command()
def cancel(job_id: Annotated[str, typer.Argument(metavar="JOB_ID")], broker: BrokerOption = None) -> None:
    """Cancel a fleet job: queued shards are dropped, running ones stop within about a second."""
    _use_broker(broker)
    from pipeline.fleet import cancel_job

    try:
        state = cancel_job(job_id)
    except KeyError as exc:
        _fail(str(exc.args[0]) if exc.args else f"unknown job {job_id!r}")
    console.print(f"cancel requested for {job_id} (status: {state['status']})")


@app.command()
def worker(
    broker: BrokerOption = None,
    queues: Annotated[str | None, typer.Option("--queues", "-Q", help="comma-separated queues")] = None,
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
) -> None:
    """Start a fleet worker (blocks); it also runs the enqueue task of 'tokenmill beat'."""
    _use_broker(broker)
    import jobs.scheduled  # noqa: F401  (registers the scheduled-job task on the app)
    from pipeline.worker import start_worker

    if metrics_port is not None:
        from pipeline.metrics import serve_metrics

        serve_metrics(metrics_port, metrics_host)

    start_worker(queues.split(",") if queues else None, concurrency, pool, loglevel, hostname,
                 grace_period=grace_period)


@app.command()
def beat(
    jobs_dir: Annotated[Path, typer.Option("--jobs", help="folder of job specs; those with a schedule are served")],
    broker: BrokerOption = None,
    queue: QueueOption = None,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "INFO",
) -> None:
    """Run Celery beat: enqueue every spec in --jobs that has a 'schedule' each time it is due."""
    _use_broker(broker)
    if queue:
        os.environ["TOKENMILL_QUEUE"] = queue
    _logging(loglevel.upper())
    from jobs.scheduled import run_beat, spec_files

    if not jobs_dir.is_dir():
        _fail(f"--jobs {jobs_dir}: not a folder", SPEC_EXIT)
    specs = {path: load_spec(path, name_file=True) for path in spec_files(jobs_dir)}
    specs = {path: spec for path, spec in specs.items() if spec.schedule}
    if not specs:
        _fail(f"no spec with a schedule in {jobs_dir}", SPEC_EXIT)
    for path, spec in specs.items():
        typer.echo(f"beat: {spec.name} ({spec.schedule}) from {path}", err=True)
    from connectors import CredentialError

    try:
        run_beat(jobs_dir, broker, loglevel.upper(), specs=specs)
    except CredentialError as exc:
        _fail(f"spec error: {exc}", SPEC_EXIT)


@app.command()
def serve(
    storage: Annotated[str, typer.Option("--storage", help="fsspec URL for uploaded files, results and metadata")],
    broker: Annotated[
        str | None, typer.Option("--broker", "-b", help="the fleet's broker; none: jobs run in this process")
    ] = None,
    queue: QueueOption = None,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p")] = 8000,
    api_keys_file: Annotated[
        Path | None, typer.Option("--api-keys-file", help="one key per line (also: $TOKENMILL_API_KEYS)")
    ] = None,
    model: Annotated[str, typer.Option("--model", help="registered model name or local directory")] = (
        "smollm2-135m-instruct"),
    served_model_name: Annotated[
        str | None, typer.Option("--served-model-name", help="the name batch requests give as body.model")
    ] = None,
    engine_options: Annotated[
        str | None, typer.Option("--engine-options", help='JSON of more [model] fields, e.g. {"num_threads": 1}')
    ] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="for requests that set none")] = 256,
    max_upload_mb: Annotated[float, typer.Option("--max-upload-mb")] = 200.0,
) -> None:
    """Serve the OpenAI Files/Batches API, /v1/jobs, /metrics and the dashboard at / (blocks)."""
    _logging()
    _use_broker(broker)
    from service.app import serve as run_server
    from service.settings import ServiceSettings, SettingsError, load_api_keys

    try:
        keys = load_api_keys(os.environ.get("TOKENMILL_API_KEYS"), api_keys_file)
        options = json.loads(engine_options) if engine_options else {}
        if not isinstance(options, dict):
            raise SettingsError("--engine-options: expected a JSON object")
    except (SettingsError, ValueError) as exc:
        _fail(f"serve: {exc}", SPEC_EXIT)
    settings = ServiceSettings(
        storage_url=storage, api_keys=keys, broker_url=broker, queue=queue,
        redis_key_prefix=os.environ.get("TOKENMILL_REDIS_KEY_PREFIX"), model=model,
        served_model_name=served_model_name, engine_options=options, default_max_tokens=max_tokens,
        max_upload_bytes=int(max_upload_mb * 1024 * 1024),
    )
    typer.echo(f"tokenmill serve: http://{host}:{port}/ ({'fleet ' + broker if broker else 'embedded runner'}, "
               f"model {settings.model_name}, storage {storage})", err=True)
    run_server(settings, host, port)


def _bench_script() -> Path:
    return Path(__file__).resolve().parent.parent / "bench" / "bench_engine.py"


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench(ctx: typer.Context) -> None:
    """The engine benchmark (bench/bench_engine.py); extra arguments are passed to it."""
    script = _bench_script()
    if not script.is_file():
        _fail("the benchmark lives in bench/bench_engine.py of a source checkout: run `make bench` there")
    spec = importlib.util.spec_from_file_location("tokenmill_bench_engine", script)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(script.parent))  # the script imports its neighbours (workload.py)
    spec.loader.exec_module(module)
    module.main(list(ctx.args))


def main(argv: list[str] | None = None) -> Any:
    return app(argv)


if __name__ == "__main__":
    app()
