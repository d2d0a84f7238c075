"""OpenAI's embeddings protocol, one definition for ``POST /v1/embeddings`` and for the Batch
API's ``/v1/embeddings`` lines: the request model, its inputs as token ids, and the
``list`` of ``embedding`` objects (floats, or base64 of little-endian float32 as the
``openai`` client asks by default)."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

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
