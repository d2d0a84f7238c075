"""What the live engine's thread holds of one HTTP request (``service/live_engine.py``): its
prompts, future and listener, and the progress a listener hears after each step."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from engine import RequestOutput, SamplingParams


@dataclass
class Progress:
    """A prompt of a call moved on in a step: ``token_ids`` are its sample's new tokens; once the
    prompt is done, ``output`` is its finished output (and ``token_ids`` is empty)."""

    prompt: int
    sample: int = 0
    token_ids: list[int] = field(default_factory=list)
    output: RequestOutput | None = None
    logprobs: list[Any] | None = None  # the new tokens' entries, when the request asks for logprobs


Listener = Callable[[list[Progress]], None]


@dataclass
class _Call:
    """One HTTP request's prompts; ``outputs`` fill in as they finish."""

    prompts: list[list[int]]
    params: list[SamplingParams]
    future: Future
    listener: Listener | None = None
    arrived: float = 0.0
    ids: list[str] = field(default_factory=list)
    outputs: dict[str, RequestOutput] = field(default_factory=dict)
    told: dict[tuple[str, int], int] = field(default_factory=dict)  # (request, sample) -> tokens handed out
    owner: str = ""  # the key's owner id: its turn in the fair share
