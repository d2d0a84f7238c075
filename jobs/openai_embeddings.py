"""OpenAI's embeddings protocol, one definition for ``POST /v1/embeddings`` and for the Batch
API's ``/v1/embeddings`` lines: the request model, its inputs as token ids, and the
``list`` of ``embedding`` objects (floats, or base64 of little-endian float32 as the
``openai`` client asks by default)."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from jobs.openai_protocol import RequestLine

EMBEDDING_URLS = ("/v1/embeddings", "/embeddings")
MAX_INPUTS = 2048  # OpenAI's limit on the inputs of one request


class EmbeddingRequest(BaseModel):
    """The body of ``/v1/embeddings``; unknown fields (``user``, new ones) change nothing."""

    model_config = ConfigDict(extra="ignore")

    input: str | list[str] | list[int] | list[list[int]] = Field(description="text(s) or token ids")
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, description="keep the first N values, then normalise")

    def prompts(self) -> list[str | list[int]]:
        """Each input as a text or token ids; raises ValueError naming an empty or excess one."""
        value = self.input
        items: list[Any] = [value] if isinstance(value, str) or (value and isinstance(value[0], int)) else list(value)
        if not items:
            raise ValueError("input: give at least one text or token list")
        if len(items) > MAX_INPUTS:
            raise ValueError(f"input: at most {MAX_INPUTS} inputs per request, got {len(items)}")
        for i, item in enumerate(items):
            if not item:
                raise ValueError(f"input[{i}]: empty input")
        return items

    def token_ids(self, tokenizer: Any) -> list[list[int]]:
        """The inputs as token ids: a text through the model's tokenizer (with its special tokens)."""
        return [list(tokenizer(p)["input_ids"]) if isinstance(p, str) else list(p) for p in self.prompts()]


def encode_vector(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, "<f4").tobytes()).decode("ascii")
    return vector.tolist()


def embeddings_body(vectors: Sequence[np.ndarray], prompt_tokens: int, model: str,
                    encoding_format: str = "float") -> dict[str, Any]:
    """OpenAI's embeddings response."""
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": encode_vector(v, encoding_format)}
                 for i, v in enumerate(vectors)],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


# ---- the Batch API's /v1/embeddings lines ------------------------------------------------
# A line becomes a row of the converted file: its one text (or token ids, as JSON text) and how
# the answer is shaped. Every line is embedded at the model's full width, normalised; the line's
# ``dimensions`` (truncated, then normalised again: the same vector as truncating first) and
# ``encoding_format`` apply when the row's output line is written (``embedding_line``).
LINE_FIELDS = ("dimensions", "encoding_format")


def embedding_row(custom_id: str, body: dict[str, Any]) -> RequestLine:
    """One ``/v1/embeddings`` line's row (no sampling values); raises ValueError naming the bad field."""
    from pydantic import ValidationError

    try:
        request = EmbeddingRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"body.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    try:
        items = request.prompts()
    except ValueError as exc:
        raise ValueError(f"body.{exc}") from None
    if len(items) != 1 or not isinstance(items[0], str):
        raise ValueError("body.input must be one text (one input per request line)")
    prompt = items[0]
    row = {"custom_id": custom_id, "text": prompt, "messages": [{"role": "user", "content": prompt}],
           "dimensions": request.dimensions, "encoding_format": request.encoding_format}
    return RequestLine(custom_id, row, {}, set(body) - {"input", "model", "user", *LINE_FIELDS})


def embedding_line(row: dict[str, Any], fields: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """Row stage of an embeddings batch: the row's output line, an ``embeddings`` list body."""
    if row.get("error") or row.get("embedding") is None:
        return {}  # the pipeline's own error line
    vector = np.asarray(row["embedding"], np.float32)
    dims = fields.get("dimensions")
    if dims is not None:
        if dims > len(vector):
            raise ValueError(f"dimensions must be at most the model's {len(vector)}, got {dims}")
        vector = vector[:dims] / np.linalg.norm(vector[:dims])
    rid = hashlib.sha1(f"{options.get('job_id', '')}\x1f{row['id']}".encode()).hexdigest()[:24]
    body = embeddings_body([vector], int(row.get("prompt_tokens") or 0), str(options.get("model", "")),
                           fields.get("encoding_format") or "float")
    return {"openai_line": {"id": f"batch_req_{rid}", "custom_id": row["id"], "error": None,
                            "response": {"status_code": 200, "request_id": f"req_{rid}", "body": body}}}
