"""Running a whole request type through the engine at once, with progress and the engine's stats.

The harness hands a model every request of a type in one call; here they all go to the
engine together (no batch-size loop), so continuous batching keeps the batch full and the
prefix cache serves a context shared by several continuations. Identical prompts with the
same parameters are computed once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from engine import LLM, RequestOutput, SamplingParams

log = logging.getLogger("lm_eval.models.tokenmill")  # shown at the harness's verbosity


@dataclass
class RunStats:
    """What the engine did for one harness call; ``summary`` is the line logged at its end."""

    what: str
    requests: int
    unique: int
    seconds: float
    engine: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return int(self.engine.get("prompt_tokens_computed", 0)) + int(self.engine.get("decode_tokens", 0))

    @property
    def prefix_hit_rate(self) -> float:
        query = self.engine.get("prefix_cache_query_tokens", 0)
        return self.engine.get("prefix_cache_hit_tokens", 0) / query if query else 0.0

    def summary(self) -> str:
        rate = self.tokens / self.seconds if self.seconds > 0 else 0.0
        return (f"tokenmill {self.what}: {self.requests} requests ({self.unique} distinct) in {self.seconds:.2f} s; "
                f"{self.engine.get('prompt_tokens_computed', 0)} prompt tokens computed, "
                f"{self.engine.get('decode_tokens', 0)} generated, {rate:,.0f} tokens/s; prefix cache hits "
                f"{self.engine.get('prefix_cache_hit_tokens', 0)} of {self.engine.get('prefix_cache_query_tokens', 0)} "
                f"tokens ({self.prefix_hit_rate:.0%})")


_COUNTERS = ("prompt_tokens_computed", "decode_tokens", "prefix_cache_query_tokens", "prefix_cache_hit_tokens",
             "preemptions", "steps")


def run_prompts(
    llm: LLM, prompts: list[list[int]], params: list[SamplingParams], what: str, progress: bool = True
) -> tuple[list[RequestOutput], RunStats]:
    """Every prompt's output, in order. Raises ``RuntimeError`` naming the first request the engine
    refused or failed: a harness metric cannot be computed over a missing answer."""
    keys = [(tuple(p), repr(sorted(s.to_dict().items()))) for p, s in zip(prompts, params, strict=True)]
    first: dict[tuple, int] = {}  # request key -> index of its first request
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    unique = sorted(first, key=lambda k: k[0])  # shared prefixes next to each other: they meet in the cache
    before = llm.stats()
    started = time.perf_counter()
    outs = llm.generate([prompts[first[k]] for k in unique], [params[first[k]] for k in unique], use_tqdm=progress)
    seconds = time.perf_counter() - started
    after = llm.stats()
    for out in outs:
        if out.error is not None or out.finish_reason == "error":
            raise RuntimeError(f"tokenmill could not run a {what} request: {out.error}")
    stats = RunStats(what, len(prompts), len(unique), seconds,
                     {k: after.get(k, 0) - before.get(k, 0) for k in _COUNTERS})
    log.info(stats.summary())
    out_of = dict(zip(unique, outs, strict=True))
    return [out_of[k] for k in keys], stats
