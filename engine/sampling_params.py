"""Per-request generation settings, validated when built so a bad value names itself."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from engine.structured_output import StructuredOutput

# One request may not take the engine from every other: the same bounds wherever a request
# enters (batch lines, specs, /v1/jobs, the Python API, LLMEngine.add_request). OpenAI's own:
MAX_N = 128  # samples of one prompt
MAX_STOP = 4  # stop strings
MAX_LOGPROBS = 20  # top alternatives per token (OpenAI's top_logprobs)
MAX_STOP_LENGTH = 1024  # characters of one stop string (matched against every step's text)
GREEDY_BELOW = 1e-5  # temperatures below this decode greedily


def greedy_temperature(temperature):
    """The one greedy rule, for a temperature or a numpy array of them (the sampler's batch)."""
    return temperature < GREEDY_BELOW


@dataclass
class SamplingParams:
    """How one request is decoded. ``temperature`` 0 (or below ``GREEDY_BELOW``) means greedy."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k filter
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1  # samples of the prompt; the prompt is computed once and its KV blocks shared
    logprobs: int | None = None  # per generated token: its logprob plus this many top alternatives
    prompt_logprobs: int | None = None  # the same for prompt tokens (the LM head then runs on them)
    # Prompt logprobs only for positions >= this one (earlier entries None): the prefix cache may
    # still serve the tokens before it. Log-likelihood scoring sets it to the context length.
    prompt_logprobs_start: int = 1
    structured_output: StructuredOutput | None = None
    # Beam search (engine/beam_search.py): keep this many beams; ``n`` of the best finished ones
    # come back, best first. Deterministic: temperature, top-k, top-p and seed do not apply.
    beam_width: int | None = None
    length_penalty: float = 1.0  # a finished beam scores sum of logprobs / (output tokens ** this)
    early_stopping: bool | str = False  # True, False or "never", as HF transformers reads them

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if isinstance(self.structured_output, dict):
            self.structured_output = StructuredOutput.from_dict(self.structured_output)
        self.validate()

    @property
    def greedy(self) -> bool:
        """Below ``GREEDY_BELOW`` the distribution is the argmax in all but float noise, and
        logits / temperature would overflow float32 (as vLLM treats it)."""
        return bool(greedy_temperature(self.temperature))

    def validate(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.temperature, int | float) or self.temperature < 0 or self.temperature != self.temperature:
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (disabled) or a positive integer, got {self.top_k!r}")
        if not isinstance(self.top_p, int | float) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if len(self.stop) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings, got {len(self.stop)}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
            if len(s) > MAX_STOP_LENGTH:
                raise ValueError(f"a stop string may be at most {MAX_STOP_LENGTH} characters, got {len(s)}")
        for t in self.stop_token_ids:
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise ValueError(f"stop_token_ids must be non-negative integers, got {t!r}")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be an integer from 1 to {MAX_N}, got {self.n!r}")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_LOGPROBS):
                raise ValueError(f"{name} must be None or an integer from 0 to {MAX_LOGPROBS}, got {v!r}")
        start = self.prompt_logprobs_start
        if isinstance(start, bool) or not isinstance(start, int) or start < 1:
            raise ValueError(f"prompt_logprobs_start must be an integer >= 1, got {start!r}")
        if self.beam_width is not None:
            self._validate_beams()
        if self.structured_output is not None:
            if not isinstance(self.structured_output, StructuredOutput):
                raise ValueError(f"structured_output must be a StructuredOutput or a dict, got {self.structured_output!r}")
            self.structured_output.validate()

    def _validate_beams(self) -> None:
        k = self.beam_width
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_N:
            raise ValueError(f"beam_width must be None or an integer from 1 to {MAX_N}, got {k!r}")
        if self.n > k:
            raise ValueError(f"n must be at most beam_width ({k}) with beam search, got {self.n}")
        lp = self.length_penalty
        if isinstance(lp, bool) or not isinstance(lp, int | float) or lp != lp or abs(lp) == float("inf"):
            raise ValueError(f"length_penalty must be a finite number, got {lp!r}")
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            raise ValueError(f"early_stopping must be true, false or \"never\", got {self.early_stopping!r}")
        for name, given in (("stop", bool(self.stop)), ("logprobs", self.logprobs is not None),
                            ("structured_output", self.structured_output is not None)):
            if given:
                raise ValueError(f"beam search does not take {name}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplingParams:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s): {', '.join(unknown)}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """Plain values only (``structured_output`` as a dict); ``from_dict`` reads it back."""
        return asdict(self)
