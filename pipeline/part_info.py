"""Shard results kept in each part's Parquet footer.

A skipped (already current) shard still has to be counted in the manifest; reading
its counts back from the footer costs one small read instead of the whole part.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from connectors import PartId, read_part_footer

log = logging.getLogger(__name__)

RESULT_KEY = b"tokenmill.result"


def result_metadata(result: dict[str, Any]) -> dict[bytes, bytes]:
    """The shard's counts (not its timing-only fields) as footer metadata."""
    keep = {k: result[k] for k in ("rows", "errors", "prompt_tokens", "output_tokens", "cached_prompt_tokens")}
    return {RESULT_KEY: json.dumps(keep).encode("utf-8")}


def read_part_result(output_url: str, part: PartId, storage_options: dict | None = None) -> dict[str, Any]:
    """Counts stored in a part's footer; {} if the part has none (written by something else)."""
    try:
        raw = read_part_footer(output_url, part, storage_options).get(RESULT_KEY)
        return json.loads(raw) if raw else {}
    except Exception as exc:  # counts are informative only; the part itself is fine
        log.warning("cannot read shard counts from part %s of %s: %s", part, output_url, exc)
        return {}
