"""The ``tokenmill`` commands about one job: run it here, submit it to the fleet, its status, cancel it.

They are plain functions here; ``cli.app`` adds them to the app with ``register``. Each imports
what reaches connectors/, pipeline/ or the engine inside its body: ``--help`` and the other
commands do not pay for pyarrow, Celery or torch (and the Celery app must not load before
``use_broker`` has exported ``--broker``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from cli.support import (
    FAILED_EXIT,
    SPEC_EXIT,
    BrokerOption,
    OldQueueOption,
    QueueOption,
    console,
    fail,
    load_spec,
    plan_or_exit,
    setup_logging,
    use_broker,
)


def register(app: typer.Typer) -> None:
    """Adds run, submit, status and cancel to ``app``, in that order (the order of ``--help``)."""
    for command in (run, submit, status, cancel):
        app.command()(command)


def run(
    spec_path: Annotated[Path, typer.Argument(metavar="JOB.toml", help="job spec (TOML or YAML)")],
    show: Annotated[int, typer.Option("--show", help="sample outputs to print at the end")] = 3,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="live progress bar")] = True,
    job_id: Annotated[str | None, typer.Option("--job-id", help="default: <name>-<random>")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the manifest as JSON instead")] = False,
) -> None:
    """Run a job here, embedded (no broker): progress, then a summary and sample outputs."""
    setup_logging()
    spec = load_spec(spec_path)
    plan = plan_or_exit(spec, job_id)
    from connectors import OutputLeased, StorageError  # lazy, as the module says
    from pipeline.job_runner import run_embedded

    try:
        manifest = run_embedded(plan, progress=progress and not as_json)
    except OutputLeased as exc:
        fail(f"output busy: {exc}")
    except StorageError as exc:
        fail(f"input error: {exc}")
    extra = {f"report ({k})": v for k, v in (manifest.get("report") or {}).items()}
    if as_json:
        typer.echo(json.dumps(manifest, indent=2, default=str))
    else:
        from jobs.console import print_run, read_samples  # lazy: reads parts through connectors

        samples = read_samples(manifest, plan.output_options, show) if show > 0 else []
        print_run(console, manifest, samples, extra)
    if manifest["status"] != "succeeded":
        raise typer.Exit(FAILED_EXIT)


def submit(
    spec_path: Annotated[Path, typer.Argument(metavar="JOB.toml", help="job spec (TOML or YAML)")],
    broker: BrokerOption = None,
    queue: QueueOption = None,
    job_id: Annotated[str | None, typer.Option("--job-id", help="default: <name>-<random>")] = None,
    old_queue: OldQueueOption = None,
) -> None:
    """Queue a job on the fleet (one task per shard) and print its job id."""
    queue = queue or old_queue
    setup_logging()
    use_broker(broker)
    spec = load_spec(spec_path)
    plan = plan_or_exit(spec, job_id)
    from connectors import CredentialError, OutputLeased, StorageError  # lazy, as the module says
    from pipeline.fleet import submit_job

    try:
        print(submit_job(plan, broker, queue=queue))
    except OutputLeased as exc:
        fail(f"output busy: {exc}")
    except StorageError as exc:
        fail(f"input error: {exc}")
    except CredentialError as exc:
        fail(f"spec error: {exc}", SPEC_EXIT)


def status(
    job: Annotated[str, typer.Argument(metavar="JOB_ID|JOB.toml", help="a fleet job id, or a spec to read its output")],
    broker: BrokerOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the status as JSON")] = False,
) -> None:
    """Per-shard state and progress of a job (live from Redis; for a spec, from its output)."""
    use_broker(broker)
    from pipeline.fleet import job_status  # lazy: the Celery app reads the broker set just above

    try:
        if Path(job).suffix.lower() in (".toml", ".yaml", ".yml") and Path(job).is_file():
            state = job_status(plan_or_exit(load_spec(Path(job)), "status", read_only=True))
        else:
            state = job_status(job)
    except KeyError as exc:
        fail(str(exc.args[0]) if exc.args else f"unknown job {job!r}")
    if as_json:
        typer.echo(json.dumps(state, indent=2, default=str))
    else:
        from jobs.console import status_table  # lazy: reads parts through connectors

        console.print(status_table(state))


def cancel(
    job: Annotated[str, typer.Argument(metavar="JOB_ID|JOB.toml", help="a fleet job id; a spec only with --release")],
    broker: BrokerOption = None,
    release: Annotated[bool, typer.Option(
        "--release", help="also release the output's lease (you know its holder is dead); with a spec: "
                          "whichever run holds it")] = False,
) -> None:
    """Cancel a fleet job: queued shards are dropped, running ones stop within about a second.
    A job that never started is cancelled at once and its output's lease released."""
    use_broker(broker)
    if Path(job).suffix.lower() in (".toml", ".yaml", ".yml") and Path(job).is_file():
        if not release:
            fail("a spec is cancelled only with --release (it releases its output's lease); cancel a job by its id")
        from connectors import public_url, read_lease, release_lease  # lazy, as the module says

        plan = plan_or_exit(load_spec(Path(job)), "release", read_only=True)
        where = public_url(plan.output_url)
        live = read_lease(plan.output_url, plan.output_options)
        if live is not None and live.holder_alive_here():  # not dead: releasing would make two writers
            fail(f"run {live.run_id} holding {where} is alive on this host (pid {live.pid}): stop it "
                 "(SIGTERM checkpoints it) instead of releasing its lease")
        held = release_lease(plan.output_url, None, plan.output_options)
        console.print(f"released the lease on {where} held by run {held.run_id} ({held.holder})" if held
                      else f"no lease on {where}", soft_wrap=True, markup=False, highlight=False)
        return
    from pipeline.fleet import cancel_job  # lazy: the Celery app reads the broker set above

    try:
        state = cancel_job(job, release=release)
    except KeyError as exc:
        fail(str(exc.args[0]) if exc.args else f"unknown job {job!r}")
    console.print(f"cancel requested for {job} (status: {state['status']})")
    for note in state.get("notes", []):
        console.print(note, soft_wrap=True, markup=False, highlight=False)
