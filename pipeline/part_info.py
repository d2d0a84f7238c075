"""Shard counts kept in each part's Parquet footer.

A skipped (already current) shard still has to be counted in the manifest; reading
its counts back from the footer costs one small read instead of the whole part.
"""

from __future__ import annotations

import json
import logging

from connectors import PartId, read_part_footer
from pipeline.shard_outcome import ShardCounts

log = logging.getLogger(__name__)

RESULT_KEY = b"tokenmill.result"


def result_metadata(counts: ShardCounts) -> dict[bytes, bytes]:
    """The shard's counts as footer metadata."""
    return {RESULT_KEY: json.dumps(counts.to_dict()).encode("utf-8")}


def read_part_result(output_url: str, part: PartId, storage_options: dict | None = None) -> ShardCounts:
    """Counts stored in a part's footer; zeros if the part has none (written by something else)."""
    try:
        raw = read_part_footer(output_url, part, storage_options).get(RESULT_KEY)
        return ShardCounts.from_dict(json.loads(raw) if raw else {})
    except Exception as exc:  # counts are informative only; the part itself is fine
        log.warning("cannot read shard counts from part %s of %s: %s", part, output_url, exc)
        return ShardCounts()
