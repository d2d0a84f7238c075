"""One spelling per option (issue 42): ``-Q/--queue`` on worker, submit, beat and serve; the older
``-q`` and ``--queues`` still work and are not shown."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from cli.app import app

runner = CliRunner()


@pytest.mark.parametrize("command", ["worker", "submit", "beat", "serve"])
def test_queue_is_spelled_one_way(command: str) -> None:
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    text = re.sub(r"\x1b\[[0-9;]*m", "", result.output)
    assert re.search(r"--queue\s+-Q\b", text), text
    assert "--queues" not in text and not re.search(r"(?<![-\w])-q\b", text)


@pytest.mark.parametrize("spelling", ["-q", "--queues", "-Q", "--queue"])
def test_every_spelling_reaches_the_command(tmp_path, spelling: str) -> None:
    """A missing spec file is a spec error (2), after the options parsed; an unknown option would be
    a usage error naming it."""
    result = runner.invoke(app, ["submit", str(tmp_path / "none.toml"), spelling, "q1"])
    assert result.exit_code == 2 and "spec error:" in result.output and "No such option" not in result.output
