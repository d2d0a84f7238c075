"""``tokenmill lm-eval ARGS``: the harness's own command line with the ``tokenmill`` model registered.

lm-eval finds external models through the ``lm_eval.models`` entry-point group (our
pyproject declares ``tokenmill`` there), but only from the release after 0.4.13; 0.4.13's
``lm_eval`` knows only the models of its own tree. This command imports the model first, so
``tokenmill lm-eval --model tokenmill ...`` takes exactly ``lm_eval``'s arguments with any
harness release. SIGTERM and SIGINT stop it with exit 143 or 130 (``pipeline.stop_signals``):
a job it runs embedded checkpoints its open shards first, and the same evaluation run again
resumes from them.
"""

from __future__ import annotations

import sys

import typer

from pipeline.stop_signals import handling_stop_signals


def register(app: typer.Typer) -> None:
    app.command("lm-eval", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
                add_help_option=False)(lm_eval)


def lm_eval(ctx: typer.Context) -> None:
    """lm-evaluation-harness's ``lm_eval`` with ``--model tokenmill`` available (the ``eval`` extra)."""
    run_lm_eval(list(ctx.args))


def run_lm_eval(args: list[str]) -> None:
    # lazy: lm-eval is the optional 'eval' extra, and the model imports torch
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        # the CLI's top level turns this into one line naming the extra (cli/errors.py)
        raise ModuleNotFoundError("lm-eval is not installed", name="lm_eval") from None
    import harness.model  # noqa: F401  (registers the model)

    saved = sys.argv
    sys.argv = ["lm_eval", *args]
    try:
        with handling_stop_signals():
            cli_evaluate()
    finally:
        sys.argv = saved
