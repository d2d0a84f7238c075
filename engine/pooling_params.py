"""What a pooling (embedding) request asks: plain data, importable without torch (the
request intake and the job layer read it; ``engine/pooling.py`` does the pooling)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from engine.pooling_config import ModelPooling

POOLING_MODES = ("last", "mean", "cls")


@dataclass
class PoolingParams:
    """How one prompt becomes a vector. ``pooling`` None: the model's own (``pooling_config``);
    ``normalize`` None: as the model says; ``dimensions``: keep the first ``dimensions`` values
    (Matryoshka), then normalise. ``resolved`` fills the model's choices in at intake."""

    pooling: str | None = None
    normalize: bool | None = None  # None: as the model's own
    dimensions: int | None = None
    n: ClassVar[int] = 1  # one sequence, no generated token: what a request's share counts
    max_tokens: ClassVar[int] = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, hidden_size: int | None = None) -> None:
        if self.pooling is not None and self.pooling not in POOLING_MODES:
            raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)}, got {self.pooling!r}")
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise ValueError(f"normalize must be true or false, got {self.normalize!r}")
        d = self.dimensions
        if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 1):
            raise ValueError(f"dimensions must be an integer >= 1, got {d!r}")
        if d is not None and hidden_size is not None and d > hidden_size:
            raise ValueError(f"dimensions must be at most the model's {hidden_size}, got {d}")

    def resolved(self, own: ModelPooling) -> PoolingParams:
        return PoolingParams(self.pooling or own.pooling, own.normalize if self.normalize is None else self.normalize,
                             self.dimensions)
