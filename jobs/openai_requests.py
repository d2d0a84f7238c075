"""OpenAI Batch API request files (``{custom_id, method, url, body}`` lines) as plain job rows.

The record readers want a non-empty text column, and a request keeps its chat in
``body.messages``; so each request file becomes a JSONL shard of rows
``{"custom_id", "text" (the last user turn), "messages"}`` written under the output's
``_requests/`` folder, which the plan then reads. Like the OpenAI API, the whole file is
validated up front: a malformed request fails the job with the line numbers, before any
generation. A converted shard is rewritten only when its content changes, so its
fingerprint (and the parts already written from it) survive a re-run.

Sampling is per request: each row carries its line's settings (``temperature``, ``top_p``,
``max_tokens`` / ``max_completion_tokens``, ``seed``, ``stop``, ``n``, ``logprobs`` /
``top_logprobs``, ``response_format``, and vLLM's ``use_beam_search`` / ``best_of`` /
``length_penalty`` / ``early_stopping``) as ``sampling``, applied over the spec's
``[sampling]``; a line's bad value fails the file up front like any other bad line.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from connectors import file_set_is_current, join_url, list_shards, read_lines, write_file_set
from engine import SamplingParams
from jobs.openai_embeddings import EMBEDDING_URLS, embedding_row
from jobs.openai_protocol import (
    ALIASES,
    BEAM_KEYS,
    BODIES,
    ChatCompletionRequest,
    CompletionRequest,
    RequestLine,
    ResponseFormat,
    SamplingFields,
    parse,
)

log = logging.getLogger(__name__)

REQUESTS_DIR = "_requests"
CONVERTED_PATTERN = "requests-*.jsonl"  # the converted shards' names: requests-<part id>.jsonl
MAX_REPORTED_ERRORS = 10
SAMPLING_FIELD = "sampling"
_SAMPLING_KEYS = ("max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop", "n", "logprobs",
                  "top_logprobs", "response_format", "ignore_eos", "stop_token_ids", "structured_outputs",
                  *BEAM_KEYS)
# Body keys that change nothing here and are accepted silently.
_IGNORED = {"model", "user", "metadata", "store", "stream", "service_tier"}


class OpenAIBatchError(ValueError):
    """The request file is not a valid chat-completions batch; the message lists the bad lines."""


@dataclass
class Conversion:
    """The converted request files. No sampling is shared by every request: each row carries its own."""

    url: str  # the converted shards, for JobPlan.input_url
    requests: int
    warnings: list[str] = field(default_factory=list)
    completions: bool = False  # the file's requests are /v1/completions (raw prompts)
    embeddings: bool = False  # the file's requests are /v1/embeddings (jobs.openai_embeddings)
    # Whether ``url`` holds exactly these converted shards (always, once written; a read-only
    # conversion says whether an earlier run left them there).
    current: bool = True


def _endpoint(line: str) -> str:
    """Which endpoint an already validated request line posts to: chat, completions or embeddings."""
    url = json.loads(line).get("url")
    if url in EMBEDDING_URLS:
        return "embeddings"
    return "completions" if BODIES[ALIASES.get(url, url)] is CompletionRequest else "chat"


def response_format_output(value: ResponseFormat) -> dict[str, Any] | None:
    """OpenAI's response_format as an engine structured_output (None for plain text)."""
    if value.type == "text":
        return None
    if value.type == "json_object":
        return {"json_object": True}
    if value.json_schema is None:
        raise ValueError("body.response_format.json_schema.schema must be a JSON object")
    return {"json": value.json_schema.schema_}


def _logprobs(body: ChatCompletionRequest) -> int | None:
    if not body.logprobs:
        if body.top_logprobs is not None:
            raise ValueError("body.top_logprobs needs body.logprobs = true")
        return None
    return body.top_logprobs or 0


def _sampling(body: SamplingFields, max_tokens: int | None, logprobs: int | None,
              response_format: ResponseFormat | None) -> dict[str, Any]:
    if body.stream:
        raise ValueError("body.stream: streaming is not available in a batch")
    values: dict[str, Any] = {}
    if max_tokens is not None:
        if max_tokens < 1:
            raise ValueError(f"body.max_tokens must be a positive integer, got {max_tokens!r}")
        values["max_tokens"] = max_tokens
    for key in ("temperature", "top_p", "seed"):
        if getattr(body, key) is not None:
            values[key] = getattr(body, key)
    if body.stop is not None:
        values["stop"] = body.stops
    if body.n is not None:
        values["n"] = body.n
    values.update(body.beam_values("body."))
    if logprobs is not None:
        values["logprobs"] = logprobs
    if response_format is not None:
        structured = response_format_output(response_format)
        if structured is not None:
            values["structured_output"] = structured
    for key in ("ignore_eos", "stop_token_ids"):
        if getattr(body, key) is not None:
            values[key] = getattr(body, key)
    if body.structured_outputs is not None:
        if "structured_output" in values:
            raise ValueError("body.structured_outputs cannot be combined with body.response_format")
        values["structured_output"] = body.structured_outputs
    try:
        SamplingParams.from_dict(values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"body: {exc}") from None
    return values


def parse_request(line: str) -> RequestLine:
    """One request line's row, its sampling values and the body keys it ignores; the body is
    read with its url's protocol model (``jobs.openai_protocol.BODIES``)."""
    try:
        request = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg}") from None
    if not isinstance(request, dict):
        raise ValueError("a request must be a JSON object")
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise ValueError("custom_id must be a non-empty string")
    if str(request.get("method", "")).upper() != "POST":
        raise ValueError(f"method must be POST, got {request.get('method')!r}")
    url = ALIASES.get(request.get("url"), request.get("url"))
    if url not in BODIES and url not in EMBEDDING_URLS:
        raise ValueError(f"url must be {', '.join(BODIES)} or {EMBEDDING_URLS[0]}, got {request.get('url')!r}")
    if not isinstance(request.get("body"), dict):
        raise ValueError("body must be a JSON object")
    raw = request["body"]
    if url in EMBEDDING_URLS:
        return embedding_row(custom_id, raw)
    body = parse(BODIES[url], raw, prefix="body.")
    if isinstance(body, CompletionRequest):
        prompt = body.prompt[0] if isinstance(body.prompt, list) and len(body.prompt) == 1 else body.prompt
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("body.prompt must be a non-empty string (one prompt per request)")
        if body.logprobs is not None or "response_format" in raw:
            raise ValueError("body.logprobs and body.response_format: only for /v1/chat/completions requests")
        sampling = _sampling(body, body.max_tokens, None, None)
        row = {"custom_id": custom_id, "text": prompt, "messages": [{"role": "user", "content": prompt}],
               SAMPLING_FIELD: sampling}
        return RequestLine(custom_id, row, sampling, set(raw) - {"prompt", *_SAMPLING_KEYS, *_IGNORED})
    if body.tools and body.tool_choice not in (None, "none", "auto"):
        raise ValueError("body.tool_choice: a forced tool call is answered on the live /v1/chat/completions route "
                         "only; a batch line would get plain text")
    messages = [m.turn(f"body.messages[{i}]") for i, m in enumerate(body.messages)]
    user_turns = [m["content"] for m in messages if m["role"] == "user"]
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    sampling = _sampling(body, max_tokens, _logprobs(body), body.response_format)
    row = {"custom_id": custom_id, "text": user_turns[-1] if user_turns else "", "messages": messages,
           SAMPLING_FIELD: sampling}
    return RequestLine(custom_id, row, sampling, set(raw) - {"messages", *_SAMPLING_KEYS, *_IGNORED})


def convert_requests(
    input_url: str, output_url: str, storage_options: dict[str, Any] | None = None, *,
    output_storage_options: dict[str, Any] | None = None, write: bool = True,
) -> Conversion:
    """Validate every request file under ``input_url`` and write the rows under ``output_url``
    (with ``output_storage_options``, default the input's). A converted file is named by its
    source's part id, so it keeps its name (and its part) when other request files come and go.
    With ``write=False`` nothing is written: ``Conversion.current`` says whether the rows are
    already there."""
    storage_options = storage_options or {}
    out_options = storage_options if output_storage_options is None else output_storage_options
    shards = list_shards(input_url, format="jsonl", storage_options=storage_options)
    target = join_url(output_url, REQUESTS_DIR)
    errors: list[str] = []
    ids: dict[str, str] = {}
    requests = 0
    ignored: set[str] = set()
    converted: list[tuple[str, str]] = []
    kinds: dict[str, str] = {}  # endpoint -> where first seen: one endpoint per file
    for shard in shards:
        rows = []
        for n, line in enumerate(read_lines(shard.url, shard.compression, storage_options), 1):
            if not line.strip():
                continue
            where = f"{shard.basename} line {n}"
            try:
                parsed = parse_request(line)
                custom_id = parsed.custom_id
                if custom_id in ids:
                    raise ValueError(f"custom_id {custom_id!r} repeats {ids[custom_id]}")
                endpoint = _endpoint(line)
                if kinds and endpoint not in kinds:
                    raise ValueError(f"url {json.loads(line)['url']!r}: one endpoint per batch "
                                     f"({next(iter(kinds.values()))} uses another)")
                kinds.setdefault(endpoint, where)
            except ValueError as exc:
                errors.append(f"{where}: {exc}")
                continue
            ids[custom_id] = where
            rows.append(json.dumps(parsed.row, ensure_ascii=False))
            requests += 1
            ignored |= parsed.ignored
        converted.append((join_url(target, f"requests-{shard.part_id}.jsonl"), "".join(r + "\n" for r in rows)))
    if errors:
        shown = "\n  ".join(errors[:MAX_REPORTED_ERRORS])
        more = f"\n  ... and {len(errors) - MAX_REPORTED_ERRORS} more" if len(errors) > MAX_REPORTED_ERRORS else ""
        raise OpenAIBatchError(f"{len(errors)} invalid request(s) in {input_url}:\n  {shown}{more}")
    if not requests:
        raise OpenAIBatchError(f"no requests in {input_url}")
    # Only shards with rows are kept: the others (and those of request files now gone) are
    # removed, since they would be read as input; an unchanged shard is not rewritten, so its
    # fingerprint (and its part) survive.
    written = [(url, text) for url, text in converted if text]
    if write:
        write_file_set(target, CONVERTED_PATTERN, written, out_options)
    current = write or file_set_is_current(target, CONVERTED_PATTERN, written, out_options)
    warnings = []
    if ignored:
        warnings.append(f"request body fields ignored: {', '.join(sorted(ignored))}")
    for warning in warnings:
        log.warning("%s", warning)
    return Conversion(url=target, requests=requests, warnings=warnings, completions="completions" in kinds,
                      embeddings="embeddings" in kinds, current=current)
