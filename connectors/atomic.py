"""Atomic object writes: write a temporary object, then move it onto the final key.

Readers of the final key see either nothing (or the previous version) or the
complete new object, never a partial one: a local move is a rename, and on S3 the
move is a server-side copy that only materialises the destination when complete.
Temporaries live under `_tmp/` next to the target, a name that input listings skip.
"""

from __future__ import annotations

import logging
import posixpath
import uuid
from collections.abc import Callable
from typing import IO

import fsspec

from connectors.storage import with_retries

log = logging.getLogger(__name__)

TMP_DIR = "_tmp"


def temp_path(path: str) -> str:
    """`<dir>/_tmp/<stem>.<uuid><ext>` for a final `<dir>/<stem><ext>`; unique per writer."""
    parent, name = posixpath.split(path)
    stem, ext = posixpath.splitext(name)
    return posixpath.join(parent, TMP_DIR, f"{stem}.{uuid.uuid4().hex}{ext}")


def _remove_quietly(fs: fsspec.AbstractFileSystem, path: str) -> None:
    try:
        if fs.exists(path):
            fs.rm_file(path)
    except Exception as exc:  # cleanup must not hide the original error
        log.warning("could not remove temporary object %s: %s", path, exc)


def atomic_write(
    fs: fsspec.AbstractFileSystem, path: str, write: Callable[[IO[bytes]], None], *, what: str
) -> None:
    """Run `write(file)` into a temporary object, then move it to `path`.

    Both steps retry transient errors; on any failure the temporary is removed
    and the exception propagates, leaving `path` untouched.
    """
    tmp = temp_path(path)

    def write_tmp() -> None:
        fs.makedirs(posixpath.dirname(tmp), exist_ok=True)
        with fs.open(tmp, "wb") as f:
            write(f)

    try:
        with_retries(write_tmp, what=f"write {what}")
        with_retries(lambda: fs.mv(tmp, path), what=f"commit {what}")
    except BaseException:
        _remove_quietly(fs, tmp)
        raise
    finally:
        fs.invalidate_cache(path)
