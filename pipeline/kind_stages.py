"""What the pipeline asks of a job kind: its request shape and its stages around the engine.

A kind is one module on an upper floor (``jobs/kinds/``); the pipeline knows it only through
this protocol and the registry (``pipeline.kind_registry``) that the upper floor fills. A plan
names its kind and carries the kind's options (``stage_options``); the worker finds the kind
in the registry and asks it for the plan's request shape (how a row becomes engine requests,
``pipeline.row_requests``) and its stages: one per finished row (the kind's extra columns),
one over the finished parts (the manifest's summary), one writing files beside them (a
report). "Stage" as Ray Data LLM says it: a step is the engine's, a stage is the kind's.
Plans travel through the broker as JSON, so a plan names a kind and nothing else: it cannot
make a worker import or call other code, and a kind the registry does not hold is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    import pyarrow as pa

    from pipeline.plan import JobPlan
    from pipeline.shard_engine import PromptEngine
    from pipeline.sub_requests import RowGroup, SubRequest


# A row stage: (the row's columns by name, the input record's fields, the kind's options) ->
# {extra column: value}, and optionally its own OpenAI line under "openai_line".
RowStageFn = Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], "dict[str, Any] | None"]
# A summary stage: (the output's rows, the kind's options) -> the manifest's JSON-safe summary.
SummaryStageFn = Callable[["pa.Table", dict[str, Any]], Any]
# A report stage: (the manifest, the output's storage options) -> {file name: url}.
ReportStageFn = Callable[[dict[str, Any], "dict[str, Any] | None"], "dict[str, str]"]
F = TypeVar("F", RowStageFn, SummaryStageFn, ReportStageFn)


class RowRejected(ValueError):
    """Raised by a row stage when the output is unusable (e.g. fails its schema): the message
    becomes the row's error as written, without the stage's name."""


@dataclass(frozen=True)
class Stage(Generic[F]):
    """One stage of a kind, typed by its function (``Stage[RowStageFn]``, ...). Its ``name`` goes in the manifest, in a failing stage's error and, for
    the row stage, in the part fingerprint: it is the ``module:function`` a plan named before the
    kinds owned their stages, kept so that parts committed then stay current."""

    name: str
    run: F


class RequestShape(Protocol):
    """How a row becomes engine requests other than one generation (``pipeline.row_requests``):
    built per plan as ``shape(plan, engine, row_params)``; ``columns`` are the result columns
    it fills (kept with a row's computed values, ``pipeline.previous_rows``)."""

    columns: ClassVar[tuple[str, ...]]

    def build(self, fields: dict[str, Any], row: int, messages: list[dict[str, str]]) -> list[SubRequest]: ...

    def values(self, group: RowGroup) -> dict[str, Any]: ...


RowParams = Callable[[dict[str, Any], int], Any]  # a row's SamplingParams (its own settings over the plan's)
ShapeFactory = Callable[["JobPlan", "PromptEngine", RowParams], RequestShape]


class KindStages(Protocol):
    """What the pipeline asks of a job kind (``jobs.kinds.base.JobKind``); None: no such stage,
    or, for ``request_shape``, one generation per row."""

    name: ClassVar[str]

    def request_shape(self, plan: JobPlan) -> ShapeFactory | None: ...

    def row_stage(self, plan: JobPlan) -> Stage[RowStageFn] | None: ...

    def summary_stage(self, plan: JobPlan) -> Stage[SummaryStageFn] | None: ...

    def report_stage(self, plan: JobPlan) -> Stage[ReportStageFn] | None: ...


def stage_name(stage: Stage[Any] | None) -> str | None:
    return None if stage is None else stage.name
