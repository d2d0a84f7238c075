"""Job kinds: each is one ``JobKind`` subclass in its own module here (``jobs.kinds.base``).

A kind's ``check(spec)`` holds its cross-field rules and ``plan_fields(spec, read_only=...)``
its part of the JobPlan (prompt, hooks, extra columns, request mode, ...). ``job_kind(name)``
imports the kind's module, which registers its class.
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
    if name not in KIND_NAMES:
        raise ValueError(f"unknown job kind {name!r}: expected one of {', '.join(KIND_NAMES)}")
    importlib.import_module(f"jobs.kinds.{name}")
    return KINDS[name]()
