"""Bearer API keys: every route but /healthz, /readyz, /health, /metrics and the dashboard needs one."""

from __future__ import annotations

import hmac
from typing import Annotated, TypeVar

from fastapi import Depends, Request

from service.errors import APIError, not_found
from service.records import Record

R = TypeVar("R", bound=Record)


def owner_for(header: str, owners: dict[str, str]) -> str:
    """The owner id of an ``Authorization`` header's key, or a 401 APIError."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise APIError(401, "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.",
                       code="missing_api_key")
    token = token.strip()
    for key, owner in owners.items():
        if hmac.compare_digest(key.encode(), token.encode()):
            return owner
    raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")


def owner_of(request: Request) -> str:
    """FastAPI dependency: the caller's owner id (a hash of its key), or 401. ``service.guard``
    has already refused a bad key before the body was read; this names the owner."""
    return owner_for(request.headers.get("authorization", ""), request.app.state.settings.owners)


Owner = Annotated[str, Depends(owner_of)]


def owned(request: Request, cls: type[R], what: str, record_id: str, owner: str) -> R:
    """The caller's record, or a 404 that reads the same whether it is missing or another key's."""
    record = request.app.state.store.get(cls, record_id, owner)
    if record is None:
        raise not_found(what, record_id)
    return record
