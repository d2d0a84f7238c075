"""Job kinds: each is one ``JobKind`` subclass in its own module here (``jobs.kinds.base``).

A kind's module holds everything about it: its options (the spec's ``[<kind>]`` table),
``check(spec)`` (its cross-field rules), ``plan_fields(spec, read_only=...)`` (its part of
the JobPlan), its request shape, its stages around the engine and its console lines. The
kinds are the modules of this package, found by name (adding a kind is adding its module);
``job_kind(name)`` imports the kind's module, whose class registers itself with the
pipeline (``pipeline.kind_registry``). Importing this package installs that lookup as the
registry's finder, so a worker finds a plan's kind the same way, and a plan can name only a
kind this process holds.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Literal

from pipeline.kind_registry import KINDS, add_finder, plan_kind

if TYPE_CHECKING:
    from jobs.kinds.base import JobKind

DEFAULT_KIND = "summarize"
# The kinds: this package's modules, the default kind first, then by name. The spec's ``kind``
# field is this type (and its error lists them in this order).
KIND_NAMES: tuple[str, ...] = tuple(sorted(
    (m.name for m in pkgutil.iter_modules(__path__) if m.name != "base"), key=lambda n: (n != DEFAULT_KIND, n)))
KindName = Literal[KIND_NAMES]  # type: ignore[valid-type]


def _import_kind(name: str) -> None:
    """The registry's finder: import the module of kind ``name`` (its class registers itself)."""
    if name in KIND_NAMES:
        importlib.import_module(f"jobs.kinds.{name}")
    elif name not in KINDS:
        raise ValueError(f"unknown job kind {name!r}: expected one of {', '.join(KIND_NAMES)}")


add_finder(_import_kind)


def job_kind(name: str) -> JobKind:
    """The kind called ``name``: one of ``KIND_NAMES``, or a class this process defined."""
    return plan_kind(name)  # type: ignore[return-value]


def all_kinds() -> list[JobKind]:
    """Every kind of this package, in ``KIND_NAMES`` order (imports their modules)."""
    return [job_kind(name) for name in KIND_NAMES]
