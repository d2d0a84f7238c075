"""The members of an engine that the pipeline uses, as typed protocols.

``engine.LLMEngine`` satisfies both; the pipeline's unit tests drive the shard driver with
a fake that does too (``tests/fake_engine.py``), so ordering, spooling, error rows, faults
and cancelling are tested in milliseconds without a model. The driver and the row
preparation call nothing else on the engine; what needs the real one (building and warming
it in ``engine_cache``, the metrics' step observer) is handed in by the callers that have it.
"""

from __future__ import annotations

from typing import Any, Protocol

from engine import RequestOutput, SamplingParams


class EngineLimits(Protocol):
    max_num_seqs: int


class PromptEngine(Protocol):
    """What turning rows into prompt tokens needs: the tokenizer and the context length."""

    max_model_len: int
    tokenizer: Any  # a Hugging Face tokenizer (encode, decode, apply_chat_template, bos/eos ids)

    def encode(self, text: str) -> list[int]: ...

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]: ...


class ShardEngine(PromptEngine, Protocol):
    """What the shard driver needs to keep requests running."""

    config: EngineLimits

    def add_request(self, request_id: str, prompt: list[int], params: SamplingParams) -> None: ...

    def abort_request(self, request_id: str) -> None: ...

    def abort_all(self) -> list[str]: ...

    def has_unfinished(self) -> bool: ...

    def step(self) -> list[RequestOutput]: ...

    def stats(self) -> dict[str, Any]: ...
