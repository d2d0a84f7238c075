"""Job kinds: how a spec of each kind becomes the kind-specific parts of a JobPlan.

Each kind module offers ``check(spec)`` (cross-field rules, raising ValueError whose
message starts with the offending field's path) and ``plan_fields(spec, read_only=...)``
(JobPlan keyword arguments: prompt, hooks, extra columns, ...; ``read_only``: build them
without writing anything, as ``tokenmill status`` does).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Literal, get_args

# The kinds, spelled here only: the spec's ``kind`` field is this type.
KindName = Literal["summarize", "evaluate", "generate", "openai_batch", "perplexity", "extract"]
KIND_NAMES: tuple[str, ...] = get_args(KindName)


def kind_module(kind: str) -> ModuleType:
    if kind not in KIND_NAMES:
        raise ValueError(f"unknown job kind {kind!r}: expected one of {', '.join(KIND_NAMES)}")
    return importlib.import_module(f"jobs.kinds.{kind}")
