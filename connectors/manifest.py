"""Small job-level objects in the output location: manifest, _SUCCESS marker, reports.

``_SUCCESS`` describes one run: a run removes it before it replaces any part and writes
it only when its own manifest says succeeded.

All writes go through the same temp + move as parts, so a reader never sees a
half-written manifest or report.
"""

from __future__ import annotations

import json
from typing import Any

from connectors.atomic import atomic_write
from connectors.storage import StorageError, filesystem_for, join_url, with_retries

MANIFEST_NAME = "_manifest.json"
SUCCESS_NAME = "_SUCCESS"


def write_bytes(url: str, data: bytes, storage_options: dict | None = None) -> None:
    """Atomically write `data` to `url`."""
    fs, path = filesystem_for(url, storage_options)
    atomic_write(fs, path, lambda f: f.write(data), what=url)


def write_text(url: str, text: str, storage_options: dict | None = None) -> None:
    """Atomically write UTF-8 `text` to `url` (reports and other small files)."""
    write_bytes(url, text.encode("utf-8"), storage_options)


def read_optional_bytes(url: str, storage_options: dict | None) -> bytes | None:
    """The object's bytes, or None if it does not exist (retried on transient errors)."""
    fs, path = filesystem_for(url, storage_options)
    fs.invalidate_cache(path)

    def read() -> bytes:
        with fs.open(path, "rb") as f:
            return f.read()

    try:
        return with_retries(read, what=f"read {url}")
    except FileNotFoundError:
        return None


def write_manifest(output_url: str, manifest: dict[str, Any], storage_options: dict | None = None) -> None:
    """`_manifest.json` under `output_url`, indented for humans."""
    text = json.dumps(manifest, indent=2) + "\n"
    write_text(join_url(output_url, MANIFEST_NAME), text, storage_options)


def read_manifest(output_url: str, storage_options: dict | None = None) -> dict[str, Any] | None:
    """The manifest, or None if there is none yet."""
    url = join_url(output_url, MANIFEST_NAME)
    data = read_optional_bytes(url, storage_options)
    if data is None:
        return None
    try:
        manifest = json.loads(data)
    except ValueError as exc:
        raise StorageError(f"corrupt manifest {url}: {exc}", url) from exc
    if not isinstance(manifest, dict):
        raise StorageError(f"corrupt manifest {url}: expected a JSON object", url)
    return manifest


def write_success_marker(output_url: str, storage_options: dict | None = None) -> None:
    """Empty `_SUCCESS`, the conventional "all parts are committed" flag."""
    write_bytes(join_url(output_url, SUCCESS_NAME), b"", storage_options)


def remove_optional(url: str, storage_options: dict | None = None) -> None:
    """Delete a small marker object if it is there (retrying transient errors); gone is fine."""
    fs, path = filesystem_for(url, storage_options)
    fs.invalidate_cache(path)
    try:
        with_retries(lambda: fs.rm_file(path), what=f"remove {url}")
    except FileNotFoundError:
        pass
    finally:
        fs.invalidate_cache(path)


def remove_success_marker(output_url: str, storage_options: dict | None = None) -> None:
    """Delete `_SUCCESS`, if there is one: a run is about to replace parts."""
    remove_optional(join_url(output_url, SUCCESS_NAME), storage_options)


def success_marker_exists(output_url: str, storage_options: dict | None = None) -> bool:
    url = join_url(output_url, SUCCESS_NAME)
    fs, path = filesystem_for(url, storage_options)
    fs.invalidate_cache(path)
    return bool(with_retries(lambda: fs.exists(path), what=f"check {url}"))
