"""Checking a batch input file the way the Batches API does, naming the line and the field.

An upload with ``purpose=batch`` must be JSONL of well-formed requests (checked by the same
parser the ``openai_batch`` job kind uses); creating a batch then checks that every line
targets the batch's endpoint and the model this server serves.
"""

from __future__ import annotations

import json

from jobs.openai_embeddings import EMBEDDING_URLS
from jobs.openai_protocol import BODIES
from jobs.openai_requests import parse_request
from service.errors import APIError, bad_request
from service.settings import DEFAULT_MAX_BATCH_LINES

SUPPORTED_ENDPOINTS = (*BODIES, EMBEDDING_URLS[0])  # the urls a batch line may post to: jobs/ says
KNOWN_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/moderations")
MAX_SHOWN = 5


def _lines(data: bytes) -> list[tuple[int, str]]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise bad_request(f"the file is not UTF-8 text (byte {exc.start})", "file", "invalid_file") from None
    return [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def _raise_first(errors: list[tuple[int, str, str | None]], code: str) -> None:
    if not errors:
        return
    shown = "; ".join(f"line {n}: {message}" for n, message, _ in errors[:MAX_SHOWN])
    more = f" (and {len(errors) - MAX_SHOWN} more)" if len(errors) > MAX_SHOWN else ""
    raise APIError(400, f"{len(errors)} invalid line(s) in the batch input: {shown}{more}",
                   param=errors[0][2], code=code)


def _field_of(message: str) -> str | None:
    first = message.split(" ", 1)[0].rstrip(":")
    return first if first in ("custom_id", "method", "url", "body") or first.startswith("body.") else None


def check_upload(data: bytes, max_lines: int = DEFAULT_MAX_BATCH_LINES) -> int:
    """The number of requests in a ``purpose=batch`` upload, or a 400 naming the bad lines.
    Counted before any line is parsed: a file over the cap costs no JSON parsing."""
    lines = _lines(data)
    if not lines:
        raise bad_request("the batch input file has no requests", "file", "empty_file")
    if len(lines) > max_lines:
        raise bad_request(f"the batch input file has {len(lines)} requests; the limit is {max_lines}", "file",
                          "too_many_requests")
    errors: list[tuple[int, str, str | None]] = []
    seen: dict[str, int] = {}
    for n, line in lines:
        try:
            request = json.loads(line)
        except json.JSONDecodeError as exc:
            errors.append((n, f"malformed JSON: {exc.msg} (column {exc.colno})", "file"))
            continue
        if isinstance(request, dict) and request.get("url") not in SUPPORTED_ENDPOINTS and \
                request.get("url") in KNOWN_ENDPOINTS:
            errors.append((n, f"endpoint {request['url']} is not served here; use {', '.join(SUPPORTED_ENDPOINTS)}",
                           "url"))
            continue
        try:
            custom_id = parse_request(line).custom_id
        except ValueError as exc:
            message = str(exc)
            errors.append((n, message, _field_of(message)))
            continue
        if custom_id in seen:
            errors.append((n, f"custom_id {custom_id!r} repeats line {seen[custom_id]}", "custom_id"))
        seen.setdefault(custom_id, n)
    _raise_first(errors, "invalid_jsonl")
    return len(lines)


def check_for_batch(data: bytes, endpoint: str, model: str) -> int:
    """Every line posts to ``endpoint`` and names ``model``; returns the request count."""
    errors: list[tuple[int, str, str | None]] = []
    lines = _lines(data)
    for n, line in lines:
        request = json.loads(line)  # checked at upload
        if request.get("url") != endpoint:
            errors.append((n, f"url {request.get('url')!r} does not match the batch endpoint {endpoint!r}", "url"))
        asked = (request.get("body") or {}).get("model")
        if asked is None:
            errors.append((n, "body.model is required", "body.model"))
        elif asked != model:
            errors.append((n, f"unknown model {asked!r}; this server serves {model!r}", "body.model"))
    _raise_first(errors, "invalid_request")
    return len(lines)
