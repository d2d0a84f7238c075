"""The image runs every command (issue 42): its build context is staged exactly as the Dockerfile's
COPY lines copy it (no Docker engine here), pip-installs into a fresh venv, and each command's
``--help`` runs from that install, with the server and the harness importable.

Fast but honest: the fresh venv reaches the already-installed dependencies through a path file
(``--no-deps``; the image gets them from PyPI, at constraints.txt's versions), while tokenmill itself
is built and installed from the staged folder only, run with this tree off ``sys.path``."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def copy_lines(dockerfile: str) -> list[tuple[list[str], str]]:
    """``(sources, destination)`` of each ``COPY`` from the build context (not ``--from`` a stage)."""
    joined = dockerfile.replace("\\\n", " ")
    copies = []
    for line in joined.splitlines():
        words = shlex.split(line.split(" #", 1)[0]) if line.strip().upper().startswith("COPY ") else []
        if words and not any(w.startswith("--from") for w in words):
            args = [w for w in words[1:] if not w.startswith("--")]
            copies.append((args[:-1], args[-1]))
    return copies


def stage_context(dockerfile: Path, into: Path) -> Path:
    """The image's /app: each COPY source copied to its destination under WORKDIR /app."""
    for sources, dest in copy_lines(dockerfile.read_text()):
        target = into / dest.removeprefix("/app/").removeprefix("./")
        for source in sources:
            src = REPO / source
            if src.is_dir():
                shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                (target if dest.endswith("/") else target.parent).mkdir(parents=True, exist_ok=True)
                shutil.copy(src, target / src.name if dest.endswith("/") else target)
    return into


def test_the_dockerfile_copies_every_package_and_the_examples() -> None:
    copied = {Path(s).name for sources, _ in copy_lines((REPO / "Dockerfile").read_text()) for s in sources}
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {p.rstrip("*") for p in packages} <= copied
    assert {"examples", "constraints.txt", "pyproject.toml", "README.md"} <= copied


@pytest.mark.timeout(600)
def test_the_staged_image_context_runs_every_command(tmp_path: Path) -> None:
    app = stage_context(REPO / "Dockerfile", tmp_path / "app")
    assert (app / "service" / "static").is_dir() and (app / "harness" / "model.py").is_file()
    assert (app / "examples" / "harness_offline.py").is_file()
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.check_output(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    # the dependencies already installed here, as plain paths (no editable tokenmill finder: its
    # .pth is only read from a site directory, which this path is not)
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", str(app)], check=True, env=env, cwd=tmp_path,
                   capture_output=True, text=True, timeout=300)
    tokenmill = env_dir / "bin" / "tokenmill"
    # tokenmill's code comes from the staged install alone (cwd and PYTHONPATH hold no copy of it);
    # lm-eval --help imports harness.model from it, and serve's package data is there
    for path in ("engine/model_loader.py", "service/app.py", "service/static/index.html", "harness/model.py"):
        assert (site / path).is_file(), path
    for command, expect in ((["--help"], "serve"), (["serve", "--help"], "--storage"),
                            (["worker", "--help"], "--queue"), (["lm-eval", "--help"], "--model")):
        result = subprocess.run([tokenmill, *command], env=env, cwd=tmp_path, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, (command, result.stderr)
        assert expect in result.stdout, (command, result.stdout[:2000])
