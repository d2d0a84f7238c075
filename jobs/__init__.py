"""Job specs, job kinds and the Python submission API (the ``tokenmill`` command is ``cli/``).

    from jobs import JobSpec, run, submit, status, wait

The names are imported on first use: a spec's ``[model]`` and ``[sampling]`` tables come
from the engine's settings, and importing the engine takes seconds that ``tokenmill
--help``, ``cancel`` or ``status JOB_ID`` do not need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobs.api import cancel, load, run, status, submit, wait
    from jobs.spec import JobSpec, SpecFileError

_HOMES = {"JobSpec": "jobs.spec", "SpecFileError": "jobs.spec", **dict.fromkeys(
    ("cancel", "load", "run", "status", "submit", "wait"), "jobs.api")}

# Installs the kinds' finder in the pipeline's registry (cheap: the kinds' modules load on first
# use), so any process that imports jobs, a fleet worker's included, can run any kind's plan.
from jobs import kinds as _kinds  # noqa: E402,F401

__all__ = ["JobSpec", "SpecFileError", "cancel", "load", "run", "status", "submit", "wait"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'jobs' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
