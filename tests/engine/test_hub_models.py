"""Models named by Hub id (``org/name``, ``revision``) resolve through huggingface_hub's own cache,
offline: the fixture lays the cache out as huggingface_hub does (``models--org--name/blobs``,
``refs/main``, ``snapshots/<commit>/`` of relative links into ``blobs``), and nothing reaches a hub
(HF_HUB_OFFLINE=1, and the endpoint points at a closed port)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hub_cache import COMMIT, REPO_ID

from engine.model_errors import ModelNotFound
from engine.model_registry import resolve_model


def test_a_hub_id_resolves_to_its_cached_snapshot(hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    snapshot = hf_home / "hub" / f"models--{REPO_ID.replace('/', '--')}" / "snapshots" / COMMIT
    assert resolve_model(REPO_ID, local_files_only=True) == snapshot  # refs/main
    assert resolve_model(REPO_ID, COMMIT, local_files_only=True) == snapshot  # a commit
    assert json.loads((snapshot / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    with pytest.raises(ModelNotFound, match=r"^model 'tiny-org/tiny-llama' at revision 'v2' is not in the "
                                            r"Hugging Face cache .* \(local_files_only\)$"):
        resolve_model(REPO_ID, "v2", local_files_only=True)
    with pytest.raises(ModelNotFound, match=r"^model 'other-org/none' is not in the Hugging Face cache"):
        resolve_model("other-org/none", local_files_only=True)
    with pytest.raises(ModelNotFound, match=r"^unknown model 'a/b/c': not a packaged model"):
        resolve_model("a/b/c")
