"""Whole small objects by URL: read, delete, list a folder's names, JSON records.

The HTTP service keeps uploaded files, result files and its own metadata (one JSON
object per file, batch or job) in the configured storage through these helpers, so
the service itself never touches a filesystem.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from connectors.manifest import read_optional_bytes, write_bytes
from connectors.storage import filesystem_for, join_url, with_retries


def read_bytes(url: str, storage_options: dict | None = None) -> bytes:
    """The object's bytes; FileNotFoundError if it does not exist."""
    data = read_optional_bytes(url, storage_options)
    if data is None:
        raise FileNotFoundError(url)
    return data


def delete_object(url: str, storage_options: dict | None = None) -> bool:
    """Remove the object (or folder tree); False if there was nothing there."""
    fs, path = filesystem_for(url, storage_options)
    fs.invalidate_cache(path)
    if not with_retries(lambda: fs.exists(path), what=f"check {url}"):
        return False
    with_retries(lambda: fs.rm(path, recursive=True), what=f"delete {url}")
    return True


def list_names(folder_url: str, suffix: str = "", storage_options: dict | None = None) -> list[str]:
    """Base names of the objects directly under ``folder_url`` ending with ``suffix``, sorted."""
    fs, path = filesystem_for(folder_url, storage_options)
    path = path.rstrip("/")
    fs.invalidate_cache(path)
    try:
        entries = with_retries(lambda: fs.ls(path, detail=False), what=f"list {folder_url}")
    except FileNotFoundError:
        return []
    names = (posixpath.basename(str(e).rstrip("/")) for e in entries)
    return sorted(n for n in names if n.endswith(suffix))


def write_json(url: str, value: dict[str, Any], storage_options: dict | None = None) -> None:
    """Atomically replace ``url`` with ``value`` as JSON."""
    write_bytes(url, json.dumps(value, sort_keys=True).encode("utf-8"), storage_options)


def read_json(url: str, storage_options: dict | None = None) -> dict[str, Any] | None:
    """The JSON object at ``url``, or None if there is none."""
    data = read_optional_bytes(url, storage_options)
    return None if data is None else json.loads(data)


def read_json_folder(folder_url: str, storage_options: dict | None = None) -> list[dict[str, Any]]:
    """Every ``*.json`` object directly under the folder (those deleted meanwhile are left out)."""
    records = []
    for name in list_names(folder_url, ".json", storage_options):
        record = read_json(join_url(folder_url, name), storage_options)
        if record is not None:
            records.append(record)
    return records
