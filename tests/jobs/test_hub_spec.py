"""A spec naming its model by Hub id (``[model] name = "org/name"``, ``revision``) runs offline from a
cache laid out as huggingface_hub lays it out (``tests/hub_cache.py``); nothing reaches a hub. The
run's stderr is empty."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from hub_cache import COMMIT, REPO_ID
from test_cli import tokenmill_cmd, write_spec

from connectors import read_parts


def test_a_hub_id_spec_runs_offline(tmp_path: Path, hf_home: Path, tiny_model_dir: Path) -> None:
    spec = write_spec(tmp_path, tiny_model_dir)
    spec.write_text(spec.read_text().replace(f'path = "{tiny_model_dir}"',
                                             f'name = "{REPO_ID}"\nrevision = "{COMMIT}"'))
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9",
           "TOKENMILL_DEBUG": "0"}
    env.pop("HF_HUB_CACHE", None)
    result = subprocess.run([*tokenmill_cmd(), "run", str(spec), "--no-progress", "--json"], capture_output=True,
                            text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    # nothing else on stderr at exit: no "nanobind: leaked ... triton" lines (torch imports triton
    # when it is installed; without a GPU the CLI hides it, cli/errors.py)
    assert result.stderr == ""
    manifest = json.loads(result.stdout)
    assert manifest["status"] == "succeeded" and manifest["totals"]["rows"] == 5
    rows = read_parts(str(tmp_path / "out")).to_pylist()
    assert len(rows) == 5 and all(r["error"] is None and r["output_tokens"] == 3 for r in rows)
