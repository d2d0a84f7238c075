"""Atomic object writes: write a temporary object, then move it onto the final key.

Readers of the final key see either nothing (or the previous version) or the
complete new object, never a partial one: a local move is a rename, and on S3 the
move is a server-side copy that only materialises the destination when complete,
then the delete of the temporary. The object is committed once the copy is done; a
worker that dies before the delete leaves a temporary under `_tmp/`, a name that input
and output listings skip. A local `_tmp/` is removed once empty, so a finished output keeps none.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import time
import uuid
from collections.abc import Callable
from typing import IO

import fsspec
from fsspec.implementations.local import LocalFileSystem

from connectors.storage import with_retries

log = logging.getLogger(__name__)

TMP_DIR = "_tmp"
# Test seam for fault tests, never set in production: see _pause_between_copy_and_delete.
PAUSE_ENV = "TOKENMILL_TEST_PAUSE_COMMIT"


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


def pause_point(env: str, path: str) -> None:
    """If the environment variable ``env`` names an existing folder, the first caller (in any
    process) to reach this point writes ``<folder>/paused`` ({"pid", "path"}) and waits for
    ``<folder>/resume``: a test can then freeze the server or kill this worker at that moment.
    Test seam for fault tests, never set in production."""
    folder = os.environ.get(env)
    if not folder or not os.path.isdir(folder):
        return
    # One name per call: two threads of one worker may reach this point at once.
    mine = os.path.join(folder, f"paused.{os.getpid()}.{uuid.uuid4().hex}")
    with open(mine, "w") as f:
        json.dump({"pid": os.getpid(), "path": path}, f)
    try:
        os.link(mine, os.path.join(folder, "paused"))  # atomic: only the first caller pauses
    except FileExistsError:
        return
    finally:
        os.remove(mine)
    while not os.path.exists(os.path.join(folder, "resume")):
        time.sleep(0.05)


def _pause_between_copy_and_delete(path: str) -> None:
    """$TOKENMILL_TEST_PAUSE_COMMIT: pause a commit with the object copied and its temporary
    not yet deleted (see ``pause_point``)."""
    pause_point(PAUSE_ENV, path)


def remove_empty_folder(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """Remove a local folder if it is empty (a finished output keeps no empty ``_tmp/``); an
    object store has no folders, only keys, so there is nothing to remove."""
    if isinstance(fs, LocalFileSystem):
        try:
            os.rmdir(path)
        except OSError:  # not empty (another writer's temporary), or gone already
            pass


def _open_tmp(fs: fsspec.AbstractFileSystem, tmp: str) -> IO[bytes]:
    """Open the temporary, making its folder; again if another writer removed the folder
    between the two (``remove_empty_folder``)."""
    for attempt in range(3):
        try:
            # os.makedirs(exist_ok=True) raises FileExistsError when the folder is removed
            # between its mkdir and its isdir check: the same race, one step earlier
            fs.makedirs(posixpath.dirname(tmp), exist_ok=True)
            return fs.open(tmp, "wb")
        except (FileNotFoundError, FileExistsError):
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _move(fs: fsspec.AbstractFileSystem, tmp: str, path: str, what: str) -> None:
    if isinstance(fs, LocalFileSystem):
        with_retries(lambda: fs.mv(tmp, path), what=f"commit {what}")
        remove_empty_folder(fs, posixpath.dirname(tmp))
        return
    with_retries(lambda: fs.copy(tmp, path), what=f"commit {what}")
    _pause_between_copy_and_delete(path)
    _remove_quietly(fs, tmp)  # committed already: a temporary left behind is only litter


def atomic_write(
    fs: fsspec.AbstractFileSystem, path: str, write: Callable[[IO[bytes]], None], *, what: str
) -> None:
    """Run `write(file)` into a temporary object, then move it to `path`.

    Both steps retry transient errors; on any failure the temporary is removed
    and the exception propagates, leaving `path` untouched.
    """
    tmp = temp_path(path)

    def write_tmp() -> None:
        with _open_tmp(fs, tmp) as f:
            write(f)

    try:
        with_retries(write_tmp, what=f"write {what}")
        _move(fs, tmp, path, what)
    except BaseException:
        _remove_quietly(fs, tmp)
        raise
    finally:
        fs.invalidate_cache(path)
