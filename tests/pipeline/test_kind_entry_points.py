"""A process that holds a plan but never imported jobs/ (a script calling ``run_embedded``, a
worker started as ``celery -A pipeline.celery_app``) still finds the plan's kind: the pipeline's
registry loads the installed package's ``tokenmill.kinds`` entry points. Two system tests ran such
a script and failed with "unknown job kind 'summarize': expected one of none registered"."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_SCRIPT = """
import sys
from pipeline.kind_registry import plan_kind
assert "jobs" not in sys.modules, "the script must start without jobs/"
print(plan_kind("summarize").name, plan_kind("classify").name, "jobs.kinds" in sys.modules)
try:
    plan_kind("no_such_kind")
except ValueError as exc:
    print(exc)
"""


def test_the_package_lists_the_kinds_entry_point() -> None:
    (point,) = [p for p in entry_points(group="tokenmill.kinds") if p.name == "jobs"]
    assert point.value == "jobs.kinds"


def test_a_process_without_jobs_finds_a_plans_kind() -> None:
    done = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    first, second = done.stdout.strip().splitlines()[-2:]
    assert first == "summarize classify True"
    assert second.startswith("unknown job kind 'no_such_kind': expected one of summarize, classify,")
