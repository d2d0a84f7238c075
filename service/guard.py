"""The door of every route but the keyless ones, before FastAPI reads a byte of the body.

FastAPI reads and parses a request's body before it resolves dependencies, so a key checked
as a dependency comes after a 200 MB upload has been taken in and parsed. This ASGI
middleware answers 401 to a request without a valid key before its body is touched, and
counts the body as it streams: JSON routes get ``max_json_bytes``, uploads
``max_upload_bytes`` plus room for the multipart framing, with or without Content-Length.
"""

from __future__ import annotations

from typing import Any

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.auth import owner_for
from service.errors import APIError
from service.settings import ServiceSettings

MULTIPART_ROOM = 64 * 1024
UPLOAD_PATH = "/v1/files"
# The only routes that answer without a key: health and readiness, Prometheus counts, the dashboard.
KEYLESS_PATHS = frozenset({"/healthz", "/readyz", "/health", "/metrics", "/"})
KEYLESS_PREFIX = "/static/"


def is_keyless(path: str) -> bool:
    """True for the public routes; everything else (``/v1/``, ``/openapi.json``, unknown paths)
    needs a key, so a route added later is closed unless it is listed here."""
    return path in KEYLESS_PATHS or (path.startswith(KEYLESS_PREFIX) and ".." not in path)


class BodyTooLarge(HTTPException):
    """Raised from ``receive``: an HTTPException, so FastAPI's body parsing passes it on as it is
    (``service.errors`` answers it with the error's code and param)."""

    def __init__(self, error: APIError) -> None:
        super().__init__(413, error.message)
        self.code, self.param = error.code, error.param


class RequestGuard:
    def __init__(self, app: ASGIApp, settings: ServiceSettings) -> None:
        self.app, self.settings = app, settings
        self.owners = settings.owners

    def limit(self, scope: Scope) -> int:
        if scope["method"] == "POST" and scope["path"].rstrip("/") == UPLOAD_PATH:
            return self.settings.max_upload_bytes + MULTIPART_ROOM
        return self.settings.max_json_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_keyless(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        try:
            owner_for(headers.get("authorization", ""), self.owners)
        except APIError as exc:
            await _answer(exc, send)
            return
        limit = self.limit(scope)
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            await _answer(_too_large(limit, scope), send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(_too_large(limit, scope))
            return message

        await self.app(scope, limited, send)


def _too_large(limit: int, scope: Scope) -> APIError:
    if scope["path"].rstrip("/") == UPLOAD_PATH:
        limit -= MULTIPART_ROOM
        return APIError(413, f"File is too large: the limit is {limit} bytes.", param="file", code="file_too_large")
    return APIError(413, f"Request body is too large: the limit is {limit} bytes.", code="request_too_large")


async def _answer(error: APIError, send: Send) -> None:
    from fastapi.responses import JSONResponse

    response = JSONResponse(error.body(), status_code=error.status)
    headers: list[Any] = response.raw_headers
    if error.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})
