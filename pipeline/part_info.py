"""A shard's counts, kept with its part.

A skipped (already current) shard still has to be counted in the manifest; the part
keeps the counts it was written with (``connectors`` stores them in its footer), so
reading them back costs one small read instead of the whole part.
"""

from __future__ import annotations

import logging

from connectors import PartId, read_part_result
from pipeline.shard_outcome import ShardCounts

log = logging.getLogger(__name__)


def read_part_counts(output_url: str, part: PartId, storage_options: dict | None = None) -> ShardCounts:
    """Counts stored with a part; zeros if the part has none (written by something else)."""
    try:
        return ShardCounts.from_dict(read_part_result(output_url, part, storage_options))
    except Exception as exc:  # counts are informative only; the part itself is fine
        log.warning("cannot read shard counts from part %s of %s: %s", part, output_url, exc)
        return ShardCounts()
