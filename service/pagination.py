"""OpenAI list pages: ``{"object": "list", "data", "first_id", "last_id", "has_more"}`` with ``after``/``limit``."""

from __future__ import annotations

from typing import Any

from service.errors import bad_request


def page(items: list[dict[str, Any]], after: str | None, limit: int, order: str = "desc") -> dict[str, Any]:
    """``items`` oldest first; the page holds up to ``limit`` items following the one with id ``after``."""
    ordered = list(reversed(items)) if order == "desc" else list(items)
    if after:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise bad_request(f"after: no object with id {after!r} in this list", "after", "invalid_value")
        ordered = ordered[ids.index(after) + 1:]
    data = ordered[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(ordered) > limit}
