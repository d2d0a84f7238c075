"""The JobKind base class and its registry, and pieces every kind shares (few-shot turns,
the default user template, the OpenAI lines' join)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from jobs.openai_merge import merge_requested, merge_summary
from pipeline.kind_steps import Step

if TYPE_CHECKING:
    from jobs.spec import JobSpec
    from pipeline.plan import JobPlan

KINDS: dict[str, type[JobKind]] = {}  # name -> class, filled as each kind's module is imported


MERGE_SUMMARY = Step("jobs.openai_merge:merge_summary", merge_summary)


class JobKind:
    """One job kind: its spec rules, its part of the JobPlan and, on the worker, its steps around
    the engine (``pipeline.kind_steps``). A subclass names itself and is registered;
    ``jobs.kinds.job_kind(name)`` finds it, for the spec and for the worker reading a plan."""

    name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        KINDS[cls.name] = cls

    def check(self, spec: JobSpec) -> None:
        """Cross-field rules: raise ValueError whose message starts with the offending field's path."""

    def plan_fields(self, spec: JobSpec, *, read_only: bool = False) -> dict[str, Any]:
        """JobPlan keyword arguments (prompt, options, extra columns, ...); ``read_only``: build them
        without writing anything, as ``tokenmill status`` does."""
        raise NotImplementedError

    # ---- on the worker: the steps of a plan this kind built (its options: plan.hook_options) ----
    def row_step(self, plan: JobPlan) -> Step | None:
        """Fills the kind's extra columns of each finished row; None: the row is kept as it is."""
        return None

    def summary_step(self, plan: JobPlan) -> Step | None:
        """The manifest's summary over the finished parts. A kind without its own joins the
        OpenAI batch lines into one file when the plan asks."""
        return MERGE_SUMMARY if plan.openai_output and merge_requested(plan.hook_options) else None

    def report_step(self, plan: JobPlan) -> Step | None:
        """Files written beside the parts once the manifest is built (the evaluation report)."""
        return None


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
