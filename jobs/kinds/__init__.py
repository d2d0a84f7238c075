"""Job kinds: each is one ``JobKind`` subclass in its own module here (``jobs.kinds.base``).

A kind's ``check(spec)`` holds its cross-field rules, ``plan_fields(spec, read_only=...)``
its part of the JobPlan (prompt, options, extra columns, request mode, ...), and
``row_step``/``summary_step``/``report_step`` what a worker does around the engine for that
plan. ``job_kind(name)`` imports the kind's module, which registers its class; the worker
finds a plan's kind the same way, so a plan can name only a kind this process holds.
"""

from __future__ import annotations

import importlib
from typing import Literal, get_args

from jobs.kinds.base import KINDS, JobKind

# The kinds, spelled here only: the spec's ``kind`` field is this type (and its error lists them).
KindName = Literal["summarize", "evaluate", "generate", "openai_batch", "perplexity", "extract",
                   "harness_requests"]
KIND_NAMES: tuple[str, ...] = get_args(KindName)


def job_kind(name: str) -> JobKind:
    """The kind called ``name``: one of ``KIND_NAMES``, or a class this process defined."""
    if name in KIND_NAMES:
        importlib.import_module(f"jobs.kinds.{name}")
    kind = KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise ValueError(f"unknown job kind {name!r}: expected one of {', '.join(KIND_NAMES)}")
    return kind()
