"""The job kinds this process holds, filled by the floors above (``jobs.kinds``).

The pipeline never imports a kind: a kind's class registers itself here when its module is
imported, and the upper floor may install a finder that imports a kind's module the first
time a plan names it (so a worker loads only the kinds its plans use). A process that holds a
plan but never imported the upper floor (a script calling ``run_embedded``, a worker started as
``celery -A pipeline.celery_app``) finds it through the installed package's entry points, group
``tokenmill.kinds`` (``pyproject.toml``: ``jobs = "jobs.kinds"``), as pytest finds its plugins:
the pipeline names a group, never a module above it. A name nobody registered is refused,
naming what is known.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points

from pipeline.kind_stages import KindStages

KINDS: dict[str, type[KindStages]] = {}  # name -> class, filled as each kind's module is imported
_finders: list[Callable[[str], None]] = []
ENTRY_POINT_GROUP = "tokenmill.kinds"
_entry_points_loaded = False


def register_kind(kind: type[KindStages]) -> None:
    KINDS[kind.name] = kind


def add_finder(finder: Callable[[str], None]) -> None:
    """``finder(name)`` imports the module of kind ``name`` (which registers it), or raises
    ValueError naming the kinds it knows."""
    if finder not in _finders:
        _finders.append(finder)


def plan_kind(name: str) -> KindStages:
    """The registered kind called ``name``; ValueError naming the kinds if there is none."""
    if not isinstance(name, str):
        raise ValueError(f"unknown job kind {name!r}")
    if not _finders:
        _load_entry_points()
    for finder in _finders:
        if name in KINDS:
            break
        finder(name)
    kind = KINDS.get(name)
    if kind is None:
        known = ", ".join(KINDS) or "none registered"
        raise ValueError(f"unknown job kind {name!r}: expected one of {known}")
    return kind()


def _load_entry_points() -> None:
    """Import what the installed packages list under ``tokenmill.kinds`` (once): each such
    module registers its kinds or installs its finder."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for point in entry_points(group=ENTRY_POINT_GROUP):
        point.load()
