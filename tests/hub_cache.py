"""A Hugging Face Hub cache laid out exactly as huggingface_hub lays out a download, for offline tests."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

REPO_ID = "tiny-org/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def write_hub_cache(hub_cache: Path, model_dir: Path, repo_id: str = REPO_ID, commit: str = COMMIT) -> Path:
    """``model_dir``'s files as huggingface_hub caches a download of ``repo_id`` at ``commit`` (main)."""
    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    blobs, snapshot = repo / "blobs", repo / "snapshots" / commit
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)  # no newline, as the hub writes it
    for file in sorted(p for p in model_dir.iterdir() if p.is_file()):
        data = file.read_bytes()
        if file.suffix == ".safetensors":  # an LFS file: its blob is named by its sha256
            blob = hashlib.sha256(data).hexdigest()
        else:  # a git file: by its git blob id
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        (blobs / blob).write_bytes(data)
        os.symlink(Path("..", "..", "blobs", blob), snapshot / file.name)
    return snapshot


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory, tiny_model_dir: Path) -> Path:
    """An HF_HOME whose hub cache holds the tiny Llama as REPO_ID at COMMIT (main)."""
    home = tmp_path_factory.mktemp("hf-home")
    write_hub_cache(home / "hub", tiny_model_dir)
    return home
