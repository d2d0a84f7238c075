"""OpenAI batch output lines: one JSON object per result row, handed to connectors with the part.

The pipeline makes a standard line per row (``connectors.part_lines`` stores a part's lines
beside it); a job kind's row stage may return its own under the key ``openai_line`` to
replace it. Ids are derived from the job and row ids, so a re-processed shard gives the
same lines.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from pipeline.result_row import OpenAIChoice, ResultRow

OPENAI_LINE_KEY = "openai_line"  # a row step's own line for its row, in the dict it returns


def _token_entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def logprobs_content(token_ids: list[int], logprobs: list[dict[int, Any]], top: int, tokenizer: Any) -> list[dict]:
    """OpenAI's ``choices[i].logprobs.content``: per generated token its text, logprob, bytes and
    the ``top`` most likely alternatives (``Logprob`` entries keyed by token id, ranks from 1)."""
    content = []
    for token_id, entry in zip(token_ids, logprobs, strict=False):
        def text(tid: int, lp: Any) -> str:
            return lp.decoded_token if lp.decoded_token is not None else tokenizer.decode([tid])

        chosen = entry[token_id]
        best = sorted(((lp.rank, tid, lp) for tid, lp in entry.items() if lp.rank is not None and lp.rank <= top))
        content.append({
            **_token_entry(text(token_id, chosen), chosen.logprob),
            "top_logprobs": [_token_entry(text(tid, lp), lp.logprob) for _, tid, lp in best],
        })
    return content


def _stable_id(*parts: str) -> str:
    return hashlib.sha1("\x1f".join(parts).encode("utf-8")).hexdigest()[:24]


def openai_line(row: ResultRow, job_id: str, model: str, completion: bool = False) -> dict[str, Any]:
    """The batch-API output object for one result row (error rows carry ``error``); the body is a
    ``chat.completion``, or a ``text_completion`` for /v1/completions requests."""
    rid = _stable_id(job_id, row.id)
    if row.error:
        return {
            "id": f"batch_req_{rid}",
            "custom_id": row.id,
            "response": None,
            "error": {"code": "invalid_request", "message": row.error},
        }
    prompt, generated = row.prompt_tokens or 0, row.output_tokens or 0
    samples = row.choices or (OpenAIChoice(0, row.output, row.finish_reason),)
    if completion:
        choices = [{"index": c.index, "text": c.text or "", "logprobs": None,
                    "finish_reason": c.finish_reason or "stop"} for c in samples]
    else:
        choices = [{"index": c.index, "message": {"role": "assistant", "content": c.text or ""},
                    "logprobs": None if c.logprobs is None else {"content": c.logprobs, "refusal": None},
                    "finish_reason": c.finish_reason or "stop"} for c in samples]
    body = {
        "id": f"{'cmpl' if completion else 'chatcmpl'}-{rid}",
        "object": "text_completion" if completion else "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated},
    }
    return {
        "id": f"batch_req_{rid}",
        "custom_id": row.id,
        "response": {"status_code": 200, "request_id": f"req_{rid}", "body": body},
        "error": None,
    }


def choices_of_line(line: dict[str, Any] | None) -> tuple[OpenAIChoice, ...] | None:
    """The row's choices an ``openai_line`` was made from (so a row taken from an earlier
    part gets the same line again, but for ``created``); None for an error line."""
    body = ((line or {}).get("response") or {}).get("body") or {}
    choices = []
    for c in body.get("choices") or ():
        message = c.get("message")
        logprobs = (c.get("logprobs") or {}).get("content") if message is not None else None
        text = message.get("content") if message is not None else c.get("text")
        choices.append(OpenAIChoice(c["index"], text, c.get("finish_reason"), logprobs))
    return tuple(choices) or None
