"""A request becomes sequences: its parameters and prompt are checked once, and each of its
samples gets its own RNG stream and grammar state."""

from __future__ import annotations

import random
from typing import Any

from engine.pooling_config import ModelPooling
from engine.pooling_params import PoolingParams
from engine.request_state import RequestState
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.structured_output import StructuredOutputBackend


class RequestError(ValueError):
    """A single request is invalid; other requests are unaffected. ``request_id`` names it
    (None where no request exists yet) and ``reason`` says why, without the id."""

    def __init__(self, request_id: str | None, reason: str) -> None:
        super().__init__(reason if request_id is None else f"request {request_id}: {reason}")
        self.request_id = request_id
        self.reason = reason


def sampling_params(request_id: str, params: SamplingParams | dict[str, Any] | None) -> SamplingParams:
    """The request's parameters, validated; a bad value is a ``RequestError`` naming the request."""
    try:
        if params is None:
            return SamplingParams()
        if isinstance(params, dict):
            return SamplingParams.from_dict(params)
        params.validate()
        return params
    except (TypeError, ValueError) as e:
        raise RequestError(request_id, f"invalid sampling parameters: {e}") from None


_PROMPT_ONLY = SamplingParams(max_tokens=1, temperature=0.0)


def _plain_ints(token_ids: list[int]) -> bool:
    """Every id is exactly an ``int``, checked in C (``map``, ``set``): a per-id Python test cost
    about 50 us a prompt, 50 ms before the first step of a 1,024-prompt ``generate`` on a GPU host."""
    return set(map(type, token_ids)) == {int}


class RequestIntake:
    """Checks what a request asks against the model and the KV cache, and builds its sequences."""

    def __init__(
        self, vocab_size: int, max_model_len: int, num_kv_blocks: int, block_size: int,
        structured: StructuredOutputBackend, seed: int, hidden_size: int | None = None,
        pooling: ModelPooling | None = None,
    ) -> None:
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.structured = structured
        self._rng = random.Random(seed)
        self.hidden_size = hidden_size
        self.pooling = pooling or ModelPooling()

    def new_embedding(self, request_id: str, token_ids: list[int], params: PoolingParams) -> RequestState:
        """An embedding request: one sequence that computes its prompt and never samples (its
        one-token budget only sizes its KV need as the prompt's own)."""
        try:
            params = params.resolved(self.pooling)
            params.validate(self.hidden_size)
        except (TypeError, ValueError) as e:
            raise RequestError(request_id, f"invalid pooling parameters: {e}") from None
        state = self.new_request(request_id, token_ids, _PROMPT_ONLY)
        state.seqs[0].pooling = params
        return state

    def new_request(self, request_id: str, token_ids: list[int], params: SamplingParams) -> RequestState:
        """The request with its first sample; raises ``RequestError`` if it can never run."""
        if not token_ids:
            raise RequestError(request_id, "empty prompt")
        vocab = self.vocab_size
        if _plain_ints(token_ids):
            outside = min(token_ids) < 0 or max(token_ids) >= vocab
        else:  # bools, int subclasses, other types: the per-id test
            outside = any((not isinstance(t, int)) or t < 0 or t >= vocab for t in token_ids)
        if outside:
            raise RequestError(request_id, f"prompt has token ids outside the vocabulary [0, {vocab})")
        if len(token_ids) >= self.max_model_len:
            raise RequestError(
                request_id, f"prompt is {len(token_ids)} tokens, the model's context is {self.max_model_len} tokens"
            )
        max_total = min(len(token_ids) + params.max_tokens, self.max_model_len)
        needed = -(-max_total // self.block_size)
        if needed > self.num_kv_blocks:
            raise RequestError(
                request_id,
                f"needs {needed} KV blocks ({max_total} tokens) but the cache has {self.num_kv_blocks} "
                "blocks in all; it can never run",
            )
        if params.structured_output is not None:
            try:
                self.structured.compile(params.structured_output)
            except ValueError as e:
                raise RequestError(request_id, str(e)) from None
        state = RequestState(request_id, token_ids, params)
        if not params.greedy:
            # an unseeded request draws its seed as it comes in, its forks none: requests draw in
            # the order they come, however the scheduler interleaves their forks with them
            state.seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        if params.prompt_logprobs is not None:
            state.prompt_logprobs = [None] * len(token_ids)
        seq = self.new_sequence(state, 0)
        seq.pending_forks = params.n - 1 if params.beam_width is None else 0  # beams fork as they search
        return state

    def new_sequence(self, state: RequestState, index: int) -> Sequence:
        """Sample ``index`` of a request: its own seed (``seed + index``) and grammar state."""
        params = state.params
        seq = Sequence(state.request_id, state.prompt_token_ids, params, sample_index=index, priority=state.priority)
        if state.seed is not None:
            # any integer seed (negative, or past 64 bits) names one of the 2**64 streams
            seq.seed = (state.seed + index) % 2**64
        if params.structured_output is not None:
            seq.matcher = self.structured.matcher(params.structured_output)
        if params.logprobs is not None:
            seq.logprobs = []
        state.seqs.append(seq)
        return seq
