"""The JobKind base class and its registry, and pieces every kind shares (few-shot turns,
the default user template)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from jobs.spec import JobSpec

KINDS: dict[str, type[JobKind]] = {}  # name -> class, filled as each kind's module is imported


class JobKind:
    """One job kind: its spec rules and its part of the JobPlan. A subclass names itself and
    is registered; ``jobs.kinds.job_kind(name)`` finds it."""

    name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        KINDS[cls.name] = cls

    def check(self, spec: JobSpec) -> None:
        """Cross-field rules: raise ValueError whose message starts with the offending field's path."""

    def plan_fields(self, spec: JobSpec, *, read_only: bool = False) -> dict[str, Any]:
        """JobPlan keyword arguments (prompt, hooks, extra columns, ...); ``read_only``: build them
        without writing anything, as ``tokenmill status`` does."""
        raise NotImplementedError


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
