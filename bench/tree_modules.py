"""Load another tree's engine modules beside the current ones, for in-process A/Bs.

A whole-step A/B between two processes cannot resolve a change of a few percent on a machine
whose speed drifts by 1.6x within minutes; two trees' modules in one process, alternated call
by call or step by step, can. ``git archive REV engine | tar -x -C /tmp/base`` makes the tree.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_before(tree: str | Path, *names: str) -> tuple[ModuleType, ...]:
    """``engine/<name>.py`` of ``tree`` for each name, as modules ``before_<name>``. Their own
    imports resolve to the current tree, so only the named modules differ."""
    modules = []
    for name in names:
        path = Path(tree) / "engine" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(f"before_{name}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
        spec.loader.exec_module(module)
        modules.append(module)
    return tuple(modules)
