"""The layering rule, checked on the source: only connectors/ touches storage, and pipeline/
knows no storage format.

Storage is reached through fsspec filesystems, which only ``connectors.storage.filesystem_for``
hands out; so a module outside connectors/ touches storage iff it imports a storage library
(fsspec and its backends, pyarrow's file formats), imports connectors' own plumbing (the
filesystem factory, the atomic write, the storage retry loop), or calls a filesystem method.
Local files a process is configured with (a spec, a JSON schema file, the service's API-key
file, model weights) are not job storage and are not looked for here.

Each check is first run on snippets that break the rule, so a checker that finds nothing
fails instead of passing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE_CONNECTORS = ("engine", "pipeline", "jobs", "service")

STORAGE_MODULES = (
    "fsspec", "s3fs", "gcsfs", "adlfs", "pyarrow.parquet", "pyarrow.dataset", "pyarrow.fs", "pyarrow.csv",
    "pyarrow.json", "connectors.atomic", "connectors.storage",
)
# Connectors' plumbing: the filesystem factory (fsspec's, too), the atomic write, the storage retry loop.
STORAGE_NAMES = {"filesystem_for", "url_to_fs", "atomic_write", "with_retries"}
# Methods only an fsspec filesystem has, whatever the receiver is called.
FILESYSTEM_ONLY_METHODS = {"rm_file", "invalidate_cache", "unstrip_protocol", "cat_file", "pipe_file", "put_file",
                           "get_file"}
# Methods of any filesystem handle (a name bound from filesystem_for / url_to_fs / fsspec.filesystem).
FILESYSTEM_METHODS = {"open", "glob", "ls", "rm", "exists", "mv", "copy", "cat", "pipe", "find", "walk", "info",
                      "isdir", "isfile", "makedirs", "touch", "rm_file"}
FORMAT_WORDS = re.compile(r"\b(parquet|jsonl|csv)\b", re.IGNORECASE)


def _is_storage_module(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in STORAGE_MODULES)


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _filesystem_handles(tree: ast.AST) -> set[str]:
    """Names bound to a filesystem: ``fs = ...`` or ``fs, path = ...`` from a filesystem factory."""
    handles = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        if _call_name(node.value.func) not in {"filesystem_for", "url_to_fs", "filesystem"}:
            continue
        for target in node.targets:
            first = target.elts[0] if isinstance(target, ast.Tuple) and target.elts else target
            if isinstance(first, ast.Name):
                handles.add(first.id)
    return handles


def storage_access(source: str, where: str) -> list[str]:
    """Every place in ``source`` that touches storage, as ``where:line: what``."""
    tree = ast.parse(source)
    handles = _filesystem_handles(tree)
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [f"{where}:{line}: imports {a.name}" for a in node.names if _is_storage_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += [f"{where}:{line}: imports {a.name} from {node.module}" for a in node.names
                      if a.name in STORAGE_NAMES or _is_storage_module(f"{node.module}.{a.name}")]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method, receiver = node.func.attr, node.func.value
            if method in FILESYSTEM_ONLY_METHODS:
                found.append(f"{where}:{line}: calls .{method}() of a filesystem")
            elif method in FILESYSTEM_METHODS and isinstance(receiver, ast.Name) and receiver.id in handles:
                found.append(f"{where}:{line}: calls {receiver.id}.{method}() on a filesystem")
        elif isinstance(node, ast.Call) and _call_name(node.func) in STORAGE_NAMES:
            found.append(f"{where}:{line}: calls {_call_name(node.func)}()")
    return found


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def storage_formats(source: str, where: str) -> list[str]:
    """Literals in ``source`` (docstrings aside) that name a storage format or are raw bytes
    (a file's metadata keys): things only connectors/ should know."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in docs:
            continue
        if isinstance(node.value, bytes):
            found.append(f"{where}:{node.lineno}: bytes literal {node.value!r}")
        elif isinstance(node.value, str) and FORMAT_WORDS.search(node.value):
            found.append(f"{where}:{node.lineno}: names a storage format: {node.value!r}")
    return found


def _modules(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def test_the_checks_catch_each_kind_of_access() -> None:
    bad_access = {
        "import fsspec": 1,
        "import pyarrow.parquet as pq": 1,
        "from pyarrow import parquet": 1,
        "from connectors.atomic import temp_path": 1,
        "from connectors import filesystem_for": 1,
        "from connectors import join_url, with_retries": 1,
        "def f(url):\n    fs, path = filesystem_for(url)\n    return fs.glob(path)": 2,
        "def f(url):\n    fs, path = filesystem_for(url)\n    with fs.open(path) as f:\n        return f.read()": 2,
        "def f(store, path):\n    store.rm_file(path)": 1,
    }
    for source, count in bad_access.items():
        assert len(storage_access(source, "snippet")) == count, source
    # Look-alikes that are not storage: a local path's glob, a zip member, the connectors API.
    fine = ("from pathlib import Path\nfiles = sorted(Path('.').glob('*.bin'))\n"
            "import zipfile\nzipfile.ZipFile('w.zip').open('a')\n"
            "from connectors import read_lines, write_part_lines\n")
    assert storage_access(fine, "snippet") == []
    assert len(storage_formats('KEY = b"tokenmill.result"\nNAME = "part-1.jsonl"\n', "snippet")) == 2
    assert storage_formats('"""Parts are Parquet files."""\nKIND = "jsonlike"\n', "snippet") == []


def test_only_connectors_touch_storage() -> None:
    modules = _modules(*OUTSIDE_CONNECTORS)
    assert {p.relative_to(ROOT).parts[0] for p in modules} == set(OUTSIDE_CONNECTORS)
    found = [hit for p in modules for hit in storage_access(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))]
    assert found == [], "storage touched outside connectors/:\n" + "\n".join(found)


def test_connectors_do_touch_storage() -> None:
    """The same check does see connectors/ touch storage (it is not blind to this code base)."""
    found = [hit for p in _modules("connectors") for hit in storage_access(p.read_text(encoding="utf-8"), p.name)]
    assert any("fsspec" in hit for hit in found) and any("rm_file" in hit for hit in found)


def test_pipeline_names_no_storage_format() -> None:
    modules = _modules("pipeline")
    found = [hit for p in modules for hit in storage_formats(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))]
    assert found == [], "storage formats named in pipeline/:\n" + "\n".join(found)
