"""Whole JSONL files a job derives from its input: read one's lines, keep a folder's set of them current.

A job kind that converts its input (OpenAI request files into plain rows) reads each
source file's lines here and leaves its converted files in a folder the plan then reads.
Such a folder is a *file set*: the files whose base names match a pattern must be exactly
the ones given, so a file is rewritten only when its text changes (its fingerprint, and the
part already written from it, survive a re-run) and one whose source is gone is removed
(it would otherwise be read as input).
"""

from __future__ import annotations

from collections.abc import Iterable

from connectors.manifest import read_optional_bytes, write_text
from connectors.storage import filesystem_for, with_retries


def read_lines(url: str, compression: str | None = None, storage_options: dict | None = None) -> list[str]:
    """The file's lines as text (``compression`` as ``ShardRef.compression`` names it; a BOM dropped)."""
    fs, path = filesystem_for(url, storage_options)

    def read() -> bytes:
        with fs.open(path, "rb", compression=compression) as f:
            return f.read()

    return with_retries(read, what=f"read {url}").decode("utf-8-sig").splitlines()


def holds_text(url: str, text: str, storage_options: dict | None = None) -> bool:
    """Whether the object at ``url`` exists and holds exactly ``text``."""
    return read_optional_bytes(url, storage_options) == text.encode("utf-8")


def _unlisted(folder_url: str, name_pattern: str, keep: Iterable[str], storage_options: dict | None) -> list[str]:
    """Paths of the files under ``folder_url`` matching ``name_pattern`` whose URL is not in ``keep``."""
    fs, path = filesystem_for(folder_url, storage_options)
    fs.invalidate_cache()
    keep_paths = {filesystem_for(url, storage_options).path for url in keep}
    found = with_retries(lambda: fs.glob(path.rstrip("/") + "/" + name_pattern), what=f"list {folder_url}")
    return [old for old in found if old not in keep_paths]


def write_file_set(
    folder_url: str, name_pattern: str, files: list[tuple[str, str]], storage_options: dict | None = None
) -> None:
    """Make the files under ``folder_url`` whose base names match ``name_pattern`` (a glob) exactly
    ``files`` (``(url, text)`` pairs): each written atomically unless it already holds its text,
    the others removed."""
    for url, text in files:
        if not holds_text(url, text, storage_options):
            write_text(url, text, storage_options)
    stale = _unlisted(folder_url, name_pattern, [url for url, _ in files], storage_options)
    fs, _ = filesystem_for(folder_url, storage_options)
    for old in stale:
        fs.rm_file(old)


def file_set_is_current(
    folder_url: str, name_pattern: str, files: list[tuple[str, str]], storage_options: dict | None = None
) -> bool:
    """Whether ``folder_url`` holds exactly what ``write_file_set`` would leave there."""
    if not all(holds_text(url, text, storage_options) for url, text in files):
        return False
    return not _unlisted(folder_url, name_pattern, [url for url, _ in files], storage_options)
