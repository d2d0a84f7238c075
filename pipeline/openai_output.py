"""OpenAI batch output lines, one JSONL file per part (``part-<id>.jsonl`` beside ``part-<id>.parquet``).

The pipeline writes a standard line per row; a job kind's row hook may return its
own under the key ``openai_line`` to replace it. Ids are derived from the job and row
ids, so a re-processed shard writes the same file.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from connectors import part_name

OPENAI_LINE_KEY = "openai_line"


def jsonl_name(part: int | str) -> str:
    return part_name(part, "jsonl")


def _stable_id(*parts: str) -> str:
    return hashlib.sha1("\x1f".join(parts).encode("utf-8")).hexdigest()[:24]


def openai_line(row: dict[str, Any], job_id: str, model: str, completion: bool = False) -> dict[str, Any]:
    """The batch-API output object for one result row (error rows carry ``error``); the body is a
    ``chat.completion``, or a ``text_completion`` for /v1/completions requests."""
    rid = _stable_id(job_id, row["id"])
    if row.get("error"):
        return {
            "id": f"batch_req_{rid}",
            "custom_id": row["id"],
            "response": None,
            "error": {"code": "invalid_request", "message": row["error"]},
        }
    prompt, generated = row.get("prompt_tokens") or 0, row.get("output_tokens") or 0
    finish = row.get("finish_reason") or "stop"
    if completion:
        choice = {"index": 0, "text": row.get("output") or "", "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": row.get("output") or ""},
                  "finish_reason": finish}
    body = {
        "id": f"{'cmpl' if completion else 'chatcmpl'}-{rid}",
        "object": "text_completion" if completion else "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated},
    }
    return {
        "id": f"batch_req_{rid}",
        "custom_id": row["id"],
        "response": {"status_code": 200, "request_id": f"req_{rid}", "body": body},
        "error": None,
    }


def lines_to_jsonl(lines: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(line, ensure_ascii=False, default=str) + "\n" for line in lines)
