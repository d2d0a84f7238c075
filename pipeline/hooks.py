"""Loading a job kind's hooks ("jobs.module:function") by name.

Plans travel through the broker as JSON, so a hook is named, not pickled. Only
modules inside the ``jobs`` package may be named: a plan must not be able to make a
worker import and call arbitrary code (``os:system``).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

_HOOK = re.compile(r"jobs(\.[A-Za-z_][A-Za-z0-9_]*)+:[A-Za-z_][A-Za-z0-9_]*\Z")


class RowRejected(ValueError):
    """Raised by a row hook when the output is unusable (e.g. fails its schema): the message
    becomes the row's error as written, without the hook's name."""


class HookError(ValueError):
    """A hook name is not allowed or does not resolve to a callable."""


def validate_hook_name(spec: str) -> None:
    """Check the shape of a hook name without importing anything."""
    if not isinstance(spec, str) or not _HOOK.match(spec):
        raise HookError(
            f"hook {spec!r} is not allowed: expected 'jobs.<module>:<function>' (only modules under 'jobs.')"
        )


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
