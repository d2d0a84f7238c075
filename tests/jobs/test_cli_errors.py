"""Every failure a user can cause from the ``tokenmill`` command is one line on stderr and its own
exit code (``cli/errors.py``), checked on the real entry point in a subprocess; ``--debug``
shows the traceback; a good ``submit`` leaves stderr empty (no Triton leak report, no
``AsyncResult.__del__`` traceback at exit)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis
from test_cli import tokenmill_cmd, write_spec

from cli.errors import BROKER_EXIT, EXTRA_EXIT, MODEL_EXIT, SPEC_EXIT, STORAGE_EXIT

DOWN = "redis://127.0.0.1:1/0"  # nothing listens on port 1
REFUSED = "broker unreachable: Error 111 connecting to 127.0.0.1:1. Connection refused."


def tokenmill(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "TOKENMILL_DEBUG": "0", **(env or {})}
    return subprocess.run([*tokenmill_cmd(), *args], capture_output=True, text=True, cwd=cwd, env=full_env,
                          timeout=300)


def one_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_broker_down_on_submit_and_status_is_one_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    spec = write_spec(tmp_path, tiny_model_dir)
    submitted = tokenmill("submit", str(spec), "--broker", DOWN)
    assert (submitted.returncode, one_line(submitted)) == (BROKER_EXIT, REFUSED)
    status = tokenmill("status", "some-job", "--broker", DOWN)
    assert (status.returncode, one_line(status)) == (BROKER_EXIT, REFUSED)

    debug = tokenmill("--debug", "status", "some-job", "--broker", DOWN)
    assert debug.returncode == BROKER_EXIT
    assert "Traceback (most recent call last)" in debug.stderr and "redis.exceptions.ConnectionError" in debug.stderr
    assert debug.stderr.splitlines()[-1] == REFUSED  # (--debug sets TOKENMILL_DEBUG=1 for the process)


def test_spec_error_is_one_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    spec = write_spec(tmp_path, tiny_model_dir, extra="")
    spec.write_text(spec.read_text().replace("max_tokens = 3", "max_tokens = 3\ntop_p = 0"))
    result = tokenmill("submit", str(spec), "--broker", DOWN)
    assert (result.returncode, one_line(result)) == (SPEC_EXIT, "spec error: sampling.top_p: Input should be greater than 0")


def _model_copy(tiny_model_dir: Path, folder: Path, **config_changes: object) -> Path:
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(config_changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_unsupported_quantization_is_one_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    fp8 = _model_copy(tiny_model_dir, tmp_path / "fp8", quantization_config={"quant_method": "fp8", "fmt": "e4m3"})
    result = tokenmill("run", str(write_spec(tmp_path / "q", fp8)), "--no-progress")
    assert (result.returncode, one_line(result)) == (
        MODEL_EXIT,
        "model error: unsupported quantization: quant_method 'fp8'; tokenmill loads "
        "compressed-tensors int8 W8A8 (int-quantized), 4-bit W4A16 (pack-quantized), FP8 (float-quantized)",
    )


def test_unsupported_architecture_and_missing_model_map_to_the_model_line(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same exit code and line shape as the quantization case above, from the exceptions the
    engine raises (in process: a subprocess per case would cost a torch import each)."""
    from huggingface_hub import constants

    from cli.errors import classify
    from engine.model_loader import load_config
    from engine.model_registry import resolve_model

    falcon = _model_copy(tiny_model_dir, tmp_path / "falcon", architectures=["FalconForCausalLM"])
    with pytest.raises(ValueError) as arch:
        load_config(falcon)
    assert classify(arch.value) == (
        MODEL_EXIT,
        f"model error: model at {falcon} has architectures ['FalconForCausalLM']; tokenmill runs Gemma3ForCausalLM, "
        "LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM, Phi3ForCausalLM, Qwen2ForCausalLM, "
        "Qwen3ForCausalLM, Qwen3MoeForCausalLM",
    )
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ValueError) as missing:
        resolve_model("no-org/no-model", local_files_only=True)
    assert classify(missing.value) == (
        MODEL_EXIT,
        f"model error: model 'no-org/no-model' is not in the Hugging Face cache {tmp_path / 'hub'} (local_files_only)",
    )


def test_unreachable_storage_is_one_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    spec = write_spec(tmp_path, tiny_model_dir)
    options = ('storage_options = {endpoint_url = "http://127.0.0.1:9", anon = true, '
               'config_kwargs = {retries = {total_max_attempts = 1, mode = "standard"}}}')
    spec.write_text(spec.read_text().replace('url = "docs/"', f'url = "s3://bucket/docs/"\n{options}'))
    result = tokenmill("submit", str(spec), "--broker", DOWN)
    assert result.returncode == STORAGE_EXIT, result.stderr
    # the connector logs each retry as a warning; the failure itself is the last line, alone
    assert result.stderr.splitlines()[-1] == (
        'storage unreachable: Could not connect to the endpoint URL: "http://127.0.0.1:9/bucket/docs"')
    assert "Traceback" not in result.stderr


def test_missing_extra_is_one_line(tmp_path: Path) -> None:
    """fastapi made absent for this process the way a missing package is (a shadowing module that
    raises what Python raises for a package that is not installed)."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "fastapi.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'fastapi'\", name='fastapi')\n")
    path = os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")])
    result = tokenmill("serve", "--storage", str(tmp_path / "store"), env={"PYTHONPATH": path})
    assert (result.returncode, one_line(result)) == (
        EXTRA_EXIT, "missing extra: this needs fastapi, from the 'server' extra: pip install 'tokenmill[server]'")


def test_a_good_submit_leaves_stderr_empty(tmp_path: Path, tiny_model_dir: Path) -> None:
    """(A good ``run`` leaving stderr empty, with no Triton leak report, is checked by
    tests/jobs/test_hub_spec.py, which runs one anyway.)"""
    queue, prefix = f"errors-{uuid.uuid4().hex[:8]}", f"errtest-{uuid.uuid4().hex[:8]}:"
    env = {"TOKENMILL_REDIS_KEY_PREFIX": prefix, "TOKENMILL_RESULT_BACKEND": "redis://127.0.0.1:6379/1"}
    client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        submitted = tokenmill("submit", str(write_spec(tmp_path / "fleet", tiny_model_dir)), "-Q", queue,
                              "--broker", "redis://127.0.0.1:6379/0", env=env)
        assert submitted.returncode == 0, submitted.stderr
        # no AsyncResult.__del__ traceback at exit: stderr holds only the warning that no worker reads the queue
        said = " ".join(submitted.stderr.split())
        assert "Traceback" not in said and "AsyncResult" not in said and "ERROR" not in said, submitted.stderr
        assert said.count("WARNING") == 1 and f"no live worker consumes queue '{queue}'" in said, submitted.stderr
        assert submitted.stdout.strip().startswith("cli-job-")
    finally:
        client.delete(queue)
        for db in (0, 1):
            keys = list(redis.Redis.from_url(f"redis://127.0.0.1:6379/{db}").scan_iter(f"{prefix}*"))
            if keys:
                redis.Redis.from_url(f"redis://127.0.0.1:6379/{db}").delete(*keys)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
