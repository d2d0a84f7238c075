"""Loading a job kind's hooks ("jobs.module:function") by name.

Plans travel through the broker as JSON, so a hook is named, not pickled. Only the hooks
of ``HOOKS`` may be named: a plan must not be able to make a worker import and call
arbitrary code (``os:system``), nor any other callable that happens to live under
``jobs.`` (``jobs.api:run``). A program that adds a kind registers its hooks with
``register_hook`` in the worker's own process; a plan cannot.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

_HOOK = re.compile(r"jobs(\.[A-Za-z_][A-Za-z0-9_]*)+:[A-Za-z_][A-Za-z0-9_]*\Z")
# The hooks the job kinds name (jobs/kinds/*.py, jobs/spec.py).
HOOKS: set[str] = {
    "jobs.extract:extract_row", "jobs.extract:summarize_extract",
    "jobs.scoring:score_row", "jobs.scoring:summarize_scores",
    "jobs.mc_scoring:score_ll_row", "jobs.mc_scoring:summarize_ll",
    "jobs.sample_metrics:majority_row", "jobs.kinds.perplexity:summarize",
    "jobs.report:write_report", "jobs.openai_merge:merge_summary",
}


class RowRejected(ValueError):
    """Raised by a row hook when the output is unusable (e.g. fails its schema): the message
    becomes the row's error as written, without the hook's name."""


class HookError(ValueError):
    """A hook name is not allowed or does not resolve to a callable."""


def register_hook(spec: str) -> None:
    """Allow one more hook in this process (its name must still be ``jobs.<module>:<function>``)."""
    if not isinstance(spec, str) or not _HOOK.match(spec):
        raise HookError(f"hook {spec!r} is not allowed: expected 'jobs.<module>:<function>' (only modules under 'jobs.')")
    HOOKS.add(spec)


def validate_hook_name(spec: str) -> None:
    """Check a hook name against the registry without importing anything."""
    if not isinstance(spec, str) or not _HOOK.match(spec):
        raise HookError(
            f"hook {spec!r} is not allowed: expected 'jobs.<module>:<function>' (only modules under 'jobs.')"
        )
    if spec not in HOOKS:
        raise HookError(f"hook {spec!r} is not a registered hook")


def load_hook(spec: str) -> Callable[..., Any]:
    """Import ``jobs.<module>`` and return its ``<function>``."""
    validate_hook_name(spec)
    module_name, func_name = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise HookError(f"hook {spec!r}: cannot import {module_name}: {exc}") from exc
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise HookError(f"hook {spec!r}: {module_name} has no function {func_name!r}")
    return fn
