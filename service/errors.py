"""OpenAI-style error bodies: ``{"error": {"message", "type", "param", "code"}}`` with its status code."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from connectors.redaction import redact
from jobs.openai_protocol import describe

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
          409: "invalid_request_error", 413: "invalid_request_error", 500: "server_error"}


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        message = redact(message)  # the last door out: no resolved credential in any answer
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}


def not_found(what: str, object_id: str) -> APIError:
    """The same answer for an id that does not exist and one that belongs to another key."""
    return APIError(404, f"No {what} found with id '{object_id}'.", param="id", code="not_found")


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_request") -> APIError:
    return APIError(400, message, param=param, code=code)


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        """A missing or mistyped field is a 400 naming the field (FastAPI would say 422)."""
        first = exc.errors()[0] if exc.errors() else {"loc": ("body",), "msg": "invalid request", "type": ""}
        loc = [p for p in first.get("loc", ()) if p not in ("body", "query", "path", "form", "header")]
        error = describe({**first, "loc": loc})
        code = "missing_required_parameter" if first.get("type") == "missing" else "invalid_value"
        return JSONResponse(bad_request(str(error), error.param or "body", code).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = getattr(exc, "code", None) or ("not_found" if exc.status_code == 404 else None)
        error = APIError(exc.status_code, str(exc.detail), param=getattr(exc, "param", None), code=code)
        return JSONResponse(error.body(), status_code=exc.status_code)
