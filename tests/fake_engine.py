"""An engine without a model, for testing the pipeline's driving in milliseconds.

It has the members of ``pipeline.shard_engine.ShardEngine`` and behaves like the real one
where the driver can tell: requests are refused with ``RequestError`` naming them, run
``max_num_seqs`` at a time in arrival order, generate one token per step and finish after
``max_tokens`` tokens (so rows with other budgets finish out of order), and ``step`` may be
made to fail. Tokens are characters: a prompt's tokens are its text's code points, and the
chat template writes each turn as ``<role>content``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine import RequestError, RequestOutput, SamplingParams


class FakeTokenizer:
    bos_token_id = None
    eos_token_id = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


@dataclass
class FakeConfig:
    max_num_seqs: int = 4


@dataclass
class _Request:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    generated: list[int] = field(default_factory=list)


class FakeEngine:
    def __init__(self, *, max_model_len: int = 512, max_num_seqs: int = 4, fail_at_step: int | None = None) -> None:
        self.config = FakeConfig(max_num_seqs)
        self.max_model_len = max_model_len
        self.tokenizer = FakeTokenizer()
        self.requests: dict[str, _Request] = {}
        self.fail_at_step = fail_at_step
        self.steps = 0
        # text in a prompt -> why add_request refuses it (a RequestError naming the request), or
        # the exception it raises instead (an engine bug)
        self.refuse: dict[str, str | Exception] = {}
        self.aborted: list[str] = []

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        return self.encode("".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>")

    def add_request(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        text = self.tokenizer.decode(prompt)
        for needle, refusal in self.refuse.items():
            if needle in text:
                raise RequestError(request_id, refusal) if isinstance(refusal, str) else refusal
        if request_id in self.requests:
            raise RequestError(request_id, "id already in use")
        if len(prompt) >= self.max_model_len:
            raise RequestError(
                request_id, f"prompt is {len(prompt)} tokens, the model's context is {self.max_model_len} tokens"
            )
        self.requests[request_id] = _Request(request_id, list(prompt), params)

    def abort_request(self, request_id: str) -> None:
        if self.requests.pop(request_id, None) is not None:
            self.aborted.append(request_id)

    def abort_all(self) -> list[str]:
        ids = list(self.requests)
        for request_id in ids:
            self.abort_request(request_id)
        return ids

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestOutput]:
        self.steps += 1
        if self.steps == self.fail_at_step:
            raise RuntimeError("simulated kernel crash")
        finished = []
        for req in list(self.requests.values())[: self.config.max_num_seqs]:
            req.generated.append(req.prompt[len(req.generated) % len(req.prompt)])
            if len(req.generated) >= req.params.max_tokens:
                del self.requests[req.request_id]
                text = self.tokenizer.decode(req.generated)
                finished.append(RequestOutput(req.request_id, req.prompt, req.generated, text, True, "length"))
        return finished

    def stats(self) -> dict[str, Any]:
        return {"kv_peak_usage": 0.0, "prefix_cache_hit_tokens": 0, "mean_running_seqs": 0.0, "preemptions": 0,
                "steps": self.steps}
