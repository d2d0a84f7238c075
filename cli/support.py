"""What every ``tokenmill`` command shares: the consoles, the broker and queue options,
the exit codes, loading a spec and building its plan (spec problems exit 2), and
pointing the process at a broker before anything imports the Celery app.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn
from urllib.parse import urlsplit, urlunsplit

import typer
from rich.console import Console
from rich.logging import RichHandler

from cli.errors import FAILED_EXIT, SPEC_EXIT

if TYPE_CHECKING:
    from jobs.spec import JobSpec
    from pipeline.plan import JobPlan

console = Console()
err = Console(stderr=True)

BrokerOption = Annotated[
    str | None, typer.Option("--broker", "-b", help="broker URL (default $TOKENMILL_BROKER_URL or local Redis)")
]
QueueOption = Annotated[
    str | None, typer.Option("--queue", "-Q", help="queue name (default $TOKENMILL_QUEUE or 'tokenmill')")
]
# The spellings before -Q/--queue was the one spelling of every command; kept working, not shown.
OldQueueOption = Annotated[str | None, typer.Option("-q", "--queues", hidden=True)]


def fail(message: str, code: int = FAILED_EXIT) -> NoReturn:
    typer.echo(message, err=True)  # plain: one unwrapped line per problem
    raise typer.Exit(code)


def setup_logging(level: str = "WARNING") -> None:
    """Warnings (and beat's INFO) to stderr through rich, unless the host process set up logging."""
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(RichHandler(console=err, show_path=False))
        root.setLevel(level)


def load_spec(path: Path, name_file: bool = False) -> JobSpec:
    """The spec, or exit 2 printing each problem as ``spec error: [<file>: ]<field>: <message>``.
    Imported here: specs import the engine (seconds), which most commands do not need."""
    from pydantic import ValidationError

    from jobs.spec import JobSpec, SpecFileError  # lazy: keeps `tokenmill --help` fast
    from jobs.spec_errors import format_errors

    try:
        return JobSpec.from_file(path)
    except SpecFileError as exc:
        fail(f"spec error: {exc}", SPEC_EXIT)
    except ValidationError as exc:
        where = f"{path}: " if name_file else ""
        fail("\n".join(f"spec error: {where}{line}" for line in format_errors(exc, JobSpec)), SPEC_EXIT)


def plan_or_exit(spec: JobSpec, job_id: str | None, *, read_only: bool = False) -> JobPlan:
    """``to_plan`` may read the input (openai_batch); input problems exit 1, spec problems 2."""
    from connectors import StorageError  # lazy: pyarrow and fsspec take most of a second

    try:
        return spec.to_plan(job_id, read_only=read_only)
    except StorageError as exc:
        fail(f"input error: {exc}")
    except ValueError as exc:
        fail(f"spec error: {exc}", SPEC_EXIT)


def use_broker(broker: str | None) -> None:
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
