"""Shard results kept in each part's Parquet footer.

A skipped (already current) shard still has to be counted in the manifest; reading
its counts back from the footer costs one small read instead of the whole part.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from connectors import filesystem_for, part_url, with_retries

log = logging.getLogger(__name__)

RESULT_KEY = b"tokenmill.result"


def with_result(table: pa.Table, result: dict[str, Any]) -> pa.Table:
    """The table with the shard's counts (not its timing-only fields) in the schema metadata."""
    keep = {k: result[k] for k in ("rows", "errors", "prompt_tokens", "output_tokens", "cached_prompt_tokens")}
    metadata = dict(table.schema.metadata or {})
    metadata[RESULT_KEY] = json.dumps(keep).encode("utf-8")
    return table.replace_schema_metadata(metadata)


def read_part_result(output_url: str, shard_index: int, storage_options: dict | None = None) -> dict[str, Any]:
    """Counts stored in a part's footer; {} if the part has none (written by something else)."""
    url = part_url(output_url, shard_index)
    fs, path = filesystem_for(url, storage_options)

    def read() -> dict[bytes, bytes]:
        with fs.open(path, "rb") as f:
            return pq.read_metadata(f).metadata or {}

    try:
        raw = with_retries(read, what=f"read footer of {url}").get(RESULT_KEY)
        return json.loads(raw) if raw else {}
    except Exception as exc:  # counts are informative only; the part itself is fine
        log.warning("cannot read shard counts from %s: %s", url, exc)
        return {}
