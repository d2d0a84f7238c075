"""``tokenmill serve`` options: where API keys come from, and refusing to start without any."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from service_stack import REPO

from service.settings import SettingsError, key_id, load_api_keys


def test_keys_from_the_environment_and_a_file(tmp_path):
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("# team keys\nsk-file-1\n\n  sk-file-2  \n")
    assert load_api_keys(" sk-env-1, ,sk-env-2", keys_file) == ["sk-env-1", "sk-env-2", "sk-file-1", "sk-file-2"]
    assert key_id("sk-env-1") != key_id("sk-env-2") and "sk-env-1" not in key_id("sk-env-1")
    with pytest.raises(SettingsError, match="no API keys"):
        load_api_keys("", None)
    with pytest.raises(SettingsError, match="--api-keys-file .*missing.txt"):
        load_api_keys("k", tmp_path / "missing.txt")


def test_serve_without_keys_exits_2_naming_the_settings(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TOKENMILL_API_KEYS"} | {"PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "cli", "serve", "--storage", str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("serve: no API keys: set TOKENMILL_API_KEYS (comma-separated) "
                                   "or give --api-keys-file")


def test_serve_passes_what_specs_may_reach_to_the_server(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import service.app
    from cli.app import app

    started = []
    monkeypatch.setattr(service.app, "serve", lambda settings, host, port: started.append(settings))
    monkeypatch.setenv("TOKENMILL_API_KEYS", "k1")
    result = CliRunner().invoke(app, [
        "serve", "--storage", str(tmp_path), "--allow-env", "AWS_*", "--allow-env", "TEAM_A_*",
        "--allow-profile", "team-a", "--allowed-url-prefix", "s3://team-a/", "--allowed-url-prefix", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (settings,) = started
    assert settings.allowed_env == ["AWS_*", "TEAM_A_*"] and settings.allowed_profiles == ["team-a"]
    assert settings.allowed_url_prefixes == ["s3://team-a/", str(tmp_path)]
    policy = settings.spec_policy()
    assert policy.allowed_env == ("AWS_*", "TEAM_A_*") and policy.storage_url == str(tmp_path)
