"""A fake engine that answers every request mode with fixed values (``test_part_bytes_pinned``).

Unlike ``tests/fake_engine.py`` it returns n samples, token logprobs, prompt logprobs and
embedding vectors, all derived from the prompt's tokens (characters), so every kind's part
can be written without a model and comes out the same on every machine.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from fake_engine import FakeEngine, FakeTokenizer

from engine import CompletionOutput, Logprob, PoolingParams, RequestOutput

# What a request generates: picked by its prompt, so the kinds' row steps see usable and bad output.
REPLIES = ('{"product": "pen", "price": 2.5}', "B", "The answer is C.", "Tokyo", "42", "not json")
# ... unless the prompt holds one of these texts (an extract row that passes its schema).
SCRIPTED = {"Trailblazer": '{"product": "backpack", "price": 49.99}'}


class PinTokenizer(FakeTokenizer):
    all_special_tokens: list[str] = []

    def __call__(self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False) -> dict:
        return {"input_ids": self.encode(text)}

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool = True,
                            add_generation_prompt: bool = True) -> Any:
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
        return text if not tokenize else self.encode(text)


def _logprob(token: int, position: int) -> Logprob:
    return Logprob(-((token * 7 + position) % 13) / 8, 1 + (token + position) % 3, None)


class PinEngine(FakeEngine):
    def __init__(self) -> None:
        super().__init__(max_model_len=4096, max_num_seqs=8)
        self.tokenizer = PinTokenizer()
        self.tokenizer.bos_token_id = 1

    def add_request(self, request_id: str, prompt: list[int], params: Any) -> None:
        if isinstance(params, PoolingParams):
            self.requests[request_id] = _Pooling(request_id, list(prompt), params)
            return
        super().add_request(request_id, prompt, params)

    def step(self) -> list[RequestOutput]:
        self.steps += 1
        finished = [self._finish(r) for r in list(self.requests.values())[: self.config.max_num_seqs]]
        for out in finished:
            del self.requests[out.request_id]
        return finished

    def _finish(self, req: Any) -> RequestOutput:
        prompt = req.prompt
        if isinstance(req, _Pooling):
            dims = req.params.dimensions or 576  # smollm2-135m's hidden size
            vector = np.array([((sum(prompt) + i) % 17) / 16 for i in range(dims)], np.float32)
            return RequestOutput(req.request_id, prompt, [], "", True, "stop", embedding=vector)
        params = req.params
        if params.prompt_logprobs is not None:
            start = params.prompt_logprobs_start or 1
            entries = [None if p < start else {t: _logprob(t, p)} for p, t in enumerate(prompt)]
            return RequestOutput(req.request_id, prompt, [33], "!", True, "length", prompt_logprobs=entries)
        samples = []
        for i in range(params.n):
            prompt_text = self.tokenizer.decode(prompt)
            reply = next((r for key, r in SCRIPTED.items() if key in prompt_text), None)
            text = (reply or REPLIES[(sum(prompt) + i) % len(REPLIES)])[: params.max_tokens]
            ids = [ord(c) for c in text]
            logprobs = None
            if params.logprobs is not None:
                logprobs = [{t: _logprob(t, p), t + 1: Logprob(-3.0, 2, None)} for p, t in enumerate(ids)]
            samples.append(CompletionOutput(i, ids, text, "stop" if len(text) < params.max_tokens else "length",
                                            logprobs))
        return RequestOutput.from_completions(req.request_id, prompt, samples)


class _Pooling:
    def __init__(self, request_id: str, prompt: list[int], params: PoolingParams) -> None:
        self.request_id, self.prompt, self.params = request_id, prompt, params
