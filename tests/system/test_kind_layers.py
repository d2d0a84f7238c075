"""A kind is one module (issue 40), checked on the source: the pipeline imports nothing from the
floors above it, and the spec, its tables, the console and the pipeline name no kind (the
registry, ``pipeline.kind_registry``, is filled from above).

Each check first runs on snippets that break the rule, so a checker that finds nothing fails
instead of passing.
"""

from __future__ import annotations

import ast
from pathlib import Path

from jobs.kinds import KIND_NAMES

ROOT = Path(__file__).resolve().parents[2]
UPPER_FLOORS = ("jobs", "service", "harness", "cli")
# Files that must name no kind: what a new kind would otherwise have to edit.
KIND_FREE = ("jobs/spec.py", "jobs/sections.py", "jobs/console.py")
# The engine's own request, one generation per row: named "generate" before kinds owned their request
# modes, and part of every plan's JSON and of each row's content key, so it keeps its spelling.
# The pooling shape's row errors say "nothing to embed" and "to embed its beginning": the verb, as
# users have read it since the shape came, not the kind.
ALLOWED = {("pipeline/plan.py", "generate"), ("pipeline/embed_requests.py", "embed")}


def upper_imports(source: str, where: str) -> list[str]:
    """Every import of an upper floor in ``source``, at any depth (a function's lazy import too)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
        found += [f"{where}:{node.lineno}: imports {n}" for n in names if n.split(".")[0] in UPPER_FLOORS]
    return found


def kind_names(source: str, where: str) -> list[str]:
    """String literals (docstrings aside) and names that are a kind's name."""
    tree = ast.parse(source)
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            words = {node.value} | set(node.value.replace("'", " ").replace('"', " ").split())
        elif isinstance(node, ast.Name | ast.arg | ast.Attribute):
            words = {getattr(node, "id", None) or getattr(node, "arg", None) or getattr(node, "attr", None)}
        else:
            continue
        found += [f"{where}:{node.lineno}: {w!r}" for w in sorted(words & set(KIND_NAMES)) if (where, w) not in ALLOWED]
    return found


def _sources(paths: list[Path]) -> list[tuple[str, str]]:
    return [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8")) for p in paths]


def test_the_checks_catch_what_they_look_for() -> None:
    assert len(upper_imports("import jobs.kinds\nfrom service import app\ndef f():\n    from jobs import x\n", "s")) == 3
    assert upper_imports("from pipeline.plan import JobPlan\nfrom . import jobs_like\nimport jobsx\n", "s") == []
    bad = 'KIND = "evaluate"\nif kind == "summarize": pass\nx = spec.extract\nmsg = f"kind \'generate\' only"\n'
    assert len(kind_names(bad, "s")) == 4
    assert kind_names('"""Kinds like evaluate live elsewhere."""\nsummary = "summaries"\n', "s") == []


def test_the_pipeline_imports_no_upper_floor() -> None:
    found = [hit for where, src in _sources(sorted((ROOT / "pipeline").rglob("*.py"))) for hit in upper_imports(src, where)]
    assert found == [], "pipeline/ imports a floor above it:\n" + "\n".join(found)


def test_spec_console_and_pipeline_name_no_kind() -> None:
    paths = [ROOT / p for p in KIND_FREE] + sorted((ROOT / "pipeline").rglob("*.py"))
    found = [hit for where, src in _sources(paths) for hit in kind_names(src, where)]
    assert found == [], "a kind named outside its module:\n" + "\n".join(found)
