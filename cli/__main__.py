"""``python -m cli``: the ``tokenmill`` command without its console script (tests, a source tree)."""

from cli.app import app

app()
