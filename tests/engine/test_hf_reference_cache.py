"""The HF reference cache hands back a stored result only under the very same key."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_reference_cache import ENV_SWITCH, cached_reference


@pytest.fixture
def model_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TOKENMILL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(ENV_SWITCH, raising=False)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"layers": 2}')
    (model / "model.safetensors").write_bytes(b"weights v1")
    return model


def test_computed_once_per_key_and_again_for_other_weights_or_requests(model_dir: Path) -> None:
    calls: list[int] = []

    def compute() -> list[list[int]]:
        calls.append(1)
        return [[len(calls), 7]]

    request = {"prompts": [[1, 2, 3]], "max_new_tokens": 2}
    assert cached_reference(model_dir, request, compute) == [[1, 7]]
    assert cached_reference(model_dir, dict(request), compute) == [[1, 7]] and len(calls) == 1  # read back

    assert cached_reference(model_dir, {**request, "max_new_tokens": 3}, compute) == [[2, 7]]
    (model_dir / "model.safetensors").write_bytes(b"weights v2")  # same size and name, other content
    assert cached_reference(model_dir, request, compute) == [[3, 7]]
    assert cached_reference(model_dir, request, compute) == [[3, 7]] and len(calls) == 3


def test_switched_off_it_always_computes(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SWITCH, "0")
    calls: list[int] = []

    def compute() -> int:
        calls.append(1)
        return len(calls)

    assert [cached_reference(model_dir, {}, compute) for _ in range(2)] == [1, 2]
    assert not (model_dir.parent / "cache" / "hf-references").exists()
