"""A job kind's steps around the engine, as the pipeline runs them.

A plan names its kind and carries the kind's options (``hook_options``); the worker finds
the kind in the in-process registry (``jobs.kinds.job_kind``) and asks it for the plan's
steps: one per finished row (the kind's extra columns), one over the finished parts (the
manifest's summary), one writing files beside them (a report). Plans travel through the
broker as JSON, so a plan names a kind and nothing else: it cannot make a worker import or
call other code, and a kind the registry does not hold is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    import pyarrow as pa

    from pipeline.plan import JobPlan

# A row step: (the row's columns by name, the input record's fields, the kind's options) ->
# {extra column: value}, and optionally its own OpenAI line under "openai_line".
RowStepFn = Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], "dict[str, Any] | None"]
# A summary step: (the output's rows, the kind's options) -> the manifest's JSON-safe summary.
SummaryStepFn = Callable[["pa.Table", dict[str, Any]], Any]
# A report step: (the manifest, the output's storage options) -> {file name: url}.
ReportStepFn = Callable[[dict[str, Any], "dict[str, Any] | None"], "dict[str, str]"]
F = TypeVar("F", RowStepFn, SummaryStepFn, ReportStepFn)


class RowRejected(ValueError):
    """Raised by a row step when the output is unusable (e.g. fails its schema): the message
    becomes the row's error as written, without the step's name."""


@dataclass(frozen=True)
class Step(Generic[F]):
    """One step of a kind, typed by its function (``Step[RowStepFn]``, ...). Its ``name`` goes in
    the manifest, in a failing step's error and, for the row step, in the part fingerprint: it is
    the ``module:function`` a plan named before the kinds owned their steps, kept so that parts
    committed then stay current."""

    name: str
    run: F


class KindSteps(Protocol):
    """What the pipeline asks of a job kind (``jobs.kinds.base.JobKind``); None: no such step."""

    def row_step(self, plan: JobPlan) -> Step[RowStepFn] | None: ...

    def summary_step(self, plan: JobPlan) -> Step[SummaryStepFn] | None: ...

    def report_step(self, plan: JobPlan) -> Step[ReportStepFn] | None: ...


def plan_kind(name: str) -> KindSteps:
    """The registered kind called ``name``; ValueError naming the kinds if there is none."""
    from jobs.kinds import job_kind  # here: jobs builds plans on top of pipeline.plan

    return job_kind(name)


def step_name(step: Step[Any] | None) -> str | None:
    return None if step is None else step.name
