"""Pieces every kind shares: few-shot turns and the default user template."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobs.spec import JobSpec


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
