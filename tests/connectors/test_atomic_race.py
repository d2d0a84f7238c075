"""A local ``_tmp/`` is removed once empty; another writer may be creating it at that moment."""

from __future__ import annotations

import os

import fsspec

from connectors import atomic


def test_write_survives_tmp_folder_removed_during_makedirs(tmp_path, monkeypatch):
    """os.makedirs(exist_ok=True) raises FileExistsError when the folder goes between its mkdir
    and its isdir check (seen in CI: two workers, one finishing its part); the write retries."""
    fs = fsspec.filesystem("file")
    target = str(tmp_path / "out" / "part.bin")
    real = fs.makedirs
    calls = {"n": 0}

    def racing_makedirs(path, exist_ok=False):
        calls["n"] += 1
        if calls["n"] == 1:
            real(path, exist_ok=exist_ok)
            os.rmdir(path)  # the other writer's remove_empty_folder wins the race
            raise FileExistsError(17, "File exists", path)
        return real(path, exist_ok=exist_ok)

    monkeypatch.setattr(fs, "makedirs", racing_makedirs)
    atomic.atomic_write(fs, target, lambda f: f.write(b"rows"), what="part")
    assert open(target, "rb").read() == b"rows"
    assert calls["n"] == 2
    assert not os.path.exists(os.path.dirname(atomic.temp_path(target)))
