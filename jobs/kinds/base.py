"""The JobKind base class, and pieces every kind shares (few-shot turns, the default user
template, the OpenAI lines' join).

A kind is one module of ``jobs/kinds/`` holding one ``JobKind`` subclass: its options (a
pydantic model, the spec's ``[<name>]`` table), its rules on the spec, its part of the plan,
its request shape and result columns, its stages around the engine and its console lines.
Defining the class registers it with the pipeline (``pipeline.kind_registry``); nothing else
names it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

from jobs.openai_merge import merge_requested, merge_summary
from pipeline.kind_registry import KINDS, register_kind
from pipeline.kind_stages import ShapeFactory, Stage
from pipeline.plan import DEFAULT_REQUEST_MODE

if TYPE_CHECKING:
    from jobs.spec import JobSpec
    from pipeline.plan import JobPlan

__all__ = ["KINDS", "JobKind"]

MERGE_SUMMARY = Stage("jobs.openai_merge:merge_summary", merge_summary)


class JobKind:
    """One job kind: its spec rules, its part of the JobPlan and, on the worker, its request shape
    and stages around the engine (``pipeline.kind_stages.KindStages``). A subclass names itself
    and is registered; ``jobs.kinds.job_kind(name)`` finds it, for the spec and for the worker."""

    name: ClassVar[str]
    # The kind's options: the spec's table named after the kind (``spec.options(...)``); None: no table.
    Options: ClassVar[type[BaseModel] | None] = None
    # Request modes other than one generation per row -> the shape that builds their requests.
    shapes: ClassVar[dict[str, ShapeFactory]] = {}
    takes_samples: ClassVar[bool] = False  # may run with [sampling] n > 1
    errors_are_results: ClassVar[bool] = False  # callers read each row's error: no error budget by default
    input_format: ClassVar[str | None] = None  # an input format only this kind reads
    openai_output: ClassVar[bool] = False  # writes OpenAI batch output lines unless the spec says no

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register_kind(cls)

    # ---- the spec ----
    def options(self, spec: JobSpec) -> Any:
        """The spec's table of this kind, else its defaults."""
        table = getattr(spec, self.name, None)
        return table if table is not None or self.Options is None else self.Options()

    def check(self, spec: JobSpec) -> None:
        """Cross-field rules: raise ValueError whose message starts with the offending field's path."""

    def plan_fields(self, spec: JobSpec, *, read_only: bool = False) -> dict[str, Any]:
        """JobPlan keyword arguments (prompt, options, extra columns, ...); ``read_only``: build them
        without writing anything, as ``tokenmill status`` does."""
        raise NotImplementedError

    # ---- on the worker: the request shape and stages of a plan this kind built ----
    def request_shape(self, plan: JobPlan) -> ShapeFactory | None:
        """How a row becomes engine requests for the plan's request mode; None: one generation."""
        if plan.request_mode == DEFAULT_REQUEST_MODE:
            return None
        shape = self.shapes.get(plan.request_mode)
        if shape is None:
            raise ValueError(f"unknown request mode {plan.request_mode!r} for kind {self.name!r}: expected one of "
                             f"{', '.join([DEFAULT_REQUEST_MODE, *self.shapes])}")
        return shape

    def row_stage(self, plan: JobPlan) -> Stage | None:
        """Fills the kind's extra columns of each finished row; None: the row is kept as it is."""
        return None

    def summary_stage(self, plan: JobPlan) -> Stage | None:
        """The manifest's summary over the finished parts. A kind without its own joins the
        OpenAI batch lines into one file when the plan asks."""
        return MERGE_SUMMARY if plan.openai_output and merge_requested(plan.stage_options) else None

    def report_stage(self, plan: JobPlan) -> Stage | None:
        """Files written beside the parts once the manifest is built (the evaluation report)."""
        return None

    # ---- the console ----
    def console_lines(self, summary: dict[str, Any]) -> list[tuple[str, str]]:
        """(label, value) lines of the end-of-run table from the manifest's summary."""
        return []


def few_shot_turns(spec: JobSpec) -> list[dict[str, str]]:
    """Worked examples as alternating user/assistant turns: part of every row's shared prefix."""
    turns: list[dict[str, str]] = []
    for example in spec.prompt.few_shot:
        turns.append({"role": "user", "content": example.user})
        turns.append({"role": "assistant", "content": example.assistant})
    return turns


def user_template(spec: JobSpec) -> str:
    """The spec's template, else the document alone."""
    return spec.prompt.template if spec.prompt.template is not None else "{" + spec.input.text_field + "}"


def reject_prompt_field(spec: JobSpec) -> None:
    if spec.prompt.prompt_field is not None:
        raise ValueError(
            f"prompt.prompt_field: only used by kind 'generate' (kind {spec.kind!r} renders prompt.template)"
        )


def reject_prompt(spec: JobSpec, why: str) -> None:
    """For kinds whose rows are not rendered through a prompt: no prompt setting may be given.
    ``why`` ends the message, after ``prompt.<field>: kind '<kind>'``."""
    for name in ("system", "template", "prompt_field"):
        if getattr(spec.prompt, name) is not None:
            raise ValueError(f"prompt.{name}: kind {spec.kind!r} {why}")
    if spec.prompt.few_shot:
        raise ValueError(f"prompt.few_shot: kind {spec.kind!r} {why}")


def reject_passthrough_clash(spec: JobSpec, columns: Iterable[str], what: str) -> None:
    """A passed-through input field may not take the name of a column the kind writes."""
    clash = sorted(set(columns) & set(spec.input.passthrough))
    if clash:
        raise ValueError(f"input.passthrough: {clash} clash with the {what} columns")
