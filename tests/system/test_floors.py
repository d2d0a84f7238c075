"""The floors, checked on the source: engine/ and connectors/ (bottom) < pipeline/ < jobs/ <
service/ and harness/ < cli/ (top). A module imports only its own floor or lower ones; the two
packages of a floor import each other not at all; and no modules import each other in a circle.

Every import statement counts, wherever it sits: at module level, inside a function (a lazy
import hides an arrow, it does not remove it) and under ``if TYPE_CHECKING:``. An import names
one module: ``from a.b import c`` is an arrow to ``a.b.c`` where that module exists, else to
``a.b``. Python also runs the packages ``a`` and ``a.b`` first; those implied arrows are not
drawn: a package that re-exports its own modules (``connectors/__init__.py``,
``engine/attention/__init__.py``) would otherwise be in a circle with every module of it, which
is the package's order of loading, not a design loop; engine/, pipeline/ and jobs/ re-export
lazily and import nothing when they run. An ``__init__``'s own imports are arrows, its
``TYPE_CHECKING`` block included, so a module inside engine/ that wrote ``from engine import
SamplingParams`` would close a circle through ``engine/__init__.py`` and be caught (what
``test_a_package_import_inside_the_package_is_a_circle`` checks). Imports by a computed name
(``importlib.import_module``) are not seen.

A module's own ``TYPE_CHECKING`` imports are arrows for the floors but not for circles: they
run nothing, so a kind's protocol may name the plan type the plan's lookup returns it under
(``pipeline.kind_stages`` and ``pipeline.plan``) without an import-time loop. A package
``__init__``'s ``TYPE_CHECKING`` block still counts for circles: it mirrors the package's lazy
re-exports, which do run on first use.

Each check is first run on snippets that break the rule, so a checker that finds nothing
fails instead of passing.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
FLOORS = {"engine": 0, "connectors": 0, "pipeline": 1, "jobs": 2, "service": 3, "harness": 3, "cli": 4}

class Arrow(NamedTuple):
    source: str
    target: str
    line: int
    typing_only: bool = False  # under ``if TYPE_CHECKING:`` in a module that is not a package

    def __str__(self) -> str:
        return f"{self.source}:{self.line} imports {self.target}"


def _owner(name: str, modules: set[str]) -> str | None:
    """The module ``name`` is, or is inside (``engine.sampling_params.SamplingParams`` ->
    ``engine.sampling_params``); None outside the floors."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def arrows(sources: dict[str, tuple[str, bool]]) -> list[Arrow]:
    """Every import between ``sources`` (module name -> (its source, whether it is a package
    ``__init__``)), at any depth of the syntax tree."""
    modules = set(sources)
    found = []
    for module, (source, is_package) in sources.items():
        package = module if is_package else module.rpartition(".")[0]
        tree = ast.parse(source)
        typing_lines = set() if is_package else _typing_only_lines(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                names = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                target = _owner(name, modules)
                if target is not None and target != module:
                    found.append(Arrow(module, target, node.lineno, node.lineno in typing_lines))
    return found


def _typing_only_lines(tree: ast.AST) -> set[int]:
    """Lines of the ``if TYPE_CHECKING:`` blocks of a module."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _floor(module: str) -> int:
    return FLOORS[module.split(".")[0]]


def upward(found: list[Arrow]) -> list[Arrow]:
    """Arrows to a higher floor."""
    return [a for a in found if _floor(a.target) > _floor(a.source)]


def sideways(found: list[Arrow]) -> list[Arrow]:
    """Arrows between the two packages of one floor (engine/connectors, service/harness)."""
    return [a for a in found if a.source.split(".")[0] != a.target.split(".")[0] and _floor(a.target) == _floor(a.source)]


def circles(found: list[Arrow]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    graph: dict[str, set[str]] = {}
    for a in found:
        if a.typing_only:  # runs nothing: no import-time loop (see the module's docstring)
            continue
        graph.setdefault(a.source, set()).add(a.target)
        graph.setdefault(a.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        result.append(frozenset(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return result


@functools.cache
def project_arrows() -> tuple[Arrow, ...]:
    return tuple(arrows(project_sources()))


def project_sources() -> dict[str, tuple[str, bool]]:
    sources = {}
    for top in FLOORS:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            sources[name] = (path.read_text(encoding="utf-8"), is_package)
    return sources


def _snippets(modules: dict[str, str]) -> list[Arrow]:
    """``arrows`` over made-up modules; a name ending in ``.__init__`` is a package."""
    return arrows({name.removesuffix(".__init__"): (source, name.endswith(".__init__"))
                   for name, source in modules.items()})


def test_the_checks_catch_each_broken_rule() -> None:
    up = _snippets({
        "pipeline.a": "from jobs.b import x\n",
        "pipeline.c": "def f():\n    from cli.app import app\n    return app\n",  # hidden in a function
        "jobs.b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from service.d import S\n",
        "engine.e": "import pipeline.a\n",
        "service.d": "from ..cli import app\n",  # relative
        "cli.app": "",
    })
    assert sorted(map(str, upward(up))) == [
        "engine.e:1 imports pipeline.a", "jobs.b:3 imports service.d", "pipeline.a:1 imports jobs.b",
        "pipeline.c:2 imports cli.app", "service.d:1 imports cli.app",
    ]
    side = _snippets({"engine.a": "from connectors.b import x\n", "connectors.b": "import engine.a\n",
                      "service.c": "def f():\n    import harness.d\n", "harness.d": "from service import c\n"})
    assert sorted(map(str, sideways(side))) == [
        "connectors.b:1 imports engine.a", "engine.a:1 imports connectors.b", "harness.d:1 imports service.c",
        "service.c:2 imports harness.d",
    ]
    ring = _snippets({"jobs.a": "from jobs.b import x\n", "jobs.b": "def f():\n    from jobs.c import y\n",
                      "jobs.c": "from . import a\n", "jobs.d": "from jobs.a import z\n"})
    assert circles(ring) == [frozenset({"jobs.a", "jobs.b", "jobs.c"})]
    typed = _snippets({"pipeline.p": "from pipeline.k import K\n",
                       "pipeline.k": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pipeline.p import P\n"})
    assert circles(typed) == []  # a type-only arrow back closes no import-time loop
    untyped = _snippets({"pipeline.p": "from pipeline.k import K\n", "pipeline.k": "from pipeline.p import P\n"})
    assert circles(untyped) == [frozenset({"pipeline.p", "pipeline.k"})]
    assert sorted(a.typing_only for a in typed) == [False, True]
    # Rules kept: downward, within one package, a package's lazy re-exports, outside names.
    fine = _snippets({
        "cli.app": "from jobs.spec import JobSpec\nimport harness.model\nimport typer\n",
        "jobs.spec": "from pipeline.plan import JobPlan\nfrom engine import SamplingParams\n",
        "pipeline.plan": "import connectors\nfrom engine.config import EngineConfig\n",
        "harness.model": "from pipeline.plan import JobPlan\n",
        "engine.__init__": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engine.config import EngineConfig\n",
        "engine.config": "import torch\n", "connectors.__init__": "from connectors.shards import ShardRef\n",
        "connectors.shards": "import fsspec\n",
    })
    assert len(fine) == 9
    assert upward(fine) == [] and sideways(fine) == [] and circles(fine) == []


def test_a_package_import_inside_the_package_is_a_circle() -> None:
    """``from engine import X`` inside engine/ runs back through the package's re-exports."""
    found = _snippets({
        "engine.__init__": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engine.llm import LLM\n",
        "engine.llm": "from engine.outputs import RequestOutput\n",
        "engine.outputs": "from engine import SamplingParams\n",
    })
    assert circles(found) == [frozenset({"engine", "engine.llm", "engine.outputs"})]


def test_the_scan_sees_this_code_base() -> None:
    """Every floor is read, and lazy (in-function) and type-only arrows of the real code are found."""
    sources = project_sources()
    assert {name.split(".")[0] for name in sources} == set(FLOORS)
    found = {(a.source, a.target) for a in project_arrows()}
    assert ("cli.job_commands", "pipeline.job_runner") in found  # inside `run`
    assert ("engine", "engine.llm") in found  # engine/__init__.py's TYPE_CHECKING block
    assert len(found) > 500


def test_no_module_imports_a_higher_floor() -> None:
    found = [str(a) for a in upward(list(project_arrows()))]
    assert found == [], "imports of a higher floor:\n" + "\n".join(found)


def test_the_packages_of_one_floor_do_not_import_each_other() -> None:
    found = [str(a) for a in sideways(list(project_arrows()))]
    assert found == [], "engine/connectors or service/harness import each other:\n" + "\n".join(found)


def test_no_import_circles() -> None:
    found = [sorted(c) for c in circles(list(project_arrows()))]
    assert found == [], f"modules importing each other in a circle: {found}"
