"""The ``tokenmill`` command: the app, its commands in the order ``--help`` lists them.

    tokenmill run JOB.toml                  embedded: this process, no broker
    tokenmill submit JOB.toml [--broker]    queue on the fleet, print the job id
    tokenmill status JOB_ID | JOB.toml      fleet state, or a spec's output state
    tokenmill cancel JOB_ID [--release]      (a spec with --release: free its output's lease)
    tokenmill worker [--broker] [-Q/--queue] a fleet worker
    tokenmill beat --jobs DIR [--broker]    enqueue specs with a ``schedule`` when due
    tokenmill serve --storage URL [--broker] the OpenAI-compatible Batches API, job routes, dashboard
    tokenmill bench                         the engine benchmark
    tokenmill lm-eval ARGS                  lm-evaluation-harness with the ``tokenmill`` model

A broker given with ``--broker`` is exported as $TOKENMILL_BROKER_URL before anything
imports the Celery app, which reads it once. Spec problems exit with status 2 and one
``spec error: <field>: <message>`` line per problem; every exit code is in ``cli.errors``.
"""

from __future__ import annotations

from typing import Any

from cli import job_commands, lm_eval_command, processes
from cli.errors import TokenmillApp

app = TokenmillApp(
    name="tokenmill", help="Batch LLM inference: run job specs embedded or on a Celery fleet.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
job_commands.register(app)  # run, submit, status, cancel
processes.register(app)  # worker, beat, serve, bench
lm_eval_command.register(app)  # lm-eval


def main(argv: list[str] | None = None) -> Any:
    return app(argv)


if __name__ == "__main__":
    app()
