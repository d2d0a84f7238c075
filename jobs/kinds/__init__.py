"""Job kinds: each is one ``JobKind`` subclass in its own module here (``jobs.kinds.base``).

A kind's ``check(spec)`` holds its cross-field rules, ``plan_fields(spec, read_only=...)``
its part of the JobPlan (prompt, options, extra columns, request mode, ...), and
``row_step``/``summary_step``/``report_step`` what a worker does around the engine for that
plan. The kinds are the modules of this package, found by name (adding a kind is adding its
module); ``job_kind(name)`` imports the kind's module, which registers its class. The worker
finds a plan's kind the same way, so a plan can name only a kind this process holds.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Literal

from jobs.kinds.base import KINDS, JobKind

# The kinds: this package's modules, the default kind first, then by name. The spec's ``kind``
# field is this type (and its error lists them in this order).
KIND_NAMES: tuple[str, ...] = tuple(sorted(
    (m.name for m in pkgutil.iter_modules(__path__) if m.name != "base"), key=lambda n: (n != "summarize", n)))
KindName = Literal[KIND_NAMES]  # type: ignore[valid-type]


def job_kind(name: str) -> JobKind:
    """The kind called ``name``: one of ``KIND_NAMES``, or a class this process defined."""
    if name in KIND_NAMES:
        importlib.import_module(f"jobs.kinds.{name}")
    kind = KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise ValueError(f"unknown job kind {name!r}: expected one of {', '.join(KIND_NAMES)}")
    return kind()
