"""A row's engine requests as types, shared by the row builder and each request mode
(``token_requests``, ``embed_requests``, ``loglikelihood``), which ``row_requests`` picks from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.outputs import RequestOutput
from engine.pooling_params import PoolingParams
from engine.sampling_params import SamplingParams


class RowInputError(ValueError):
    """The row cannot become a request (bad choices, bad per-row sampling); the message names the row."""


def make_params(values: dict[str, Any]) -> SamplingParams:
    """SamplingParams from plain data (``structured_output`` given as a dict)."""
    return SamplingParams.from_dict(values)


@dataclass
class SubRequest:
    """One engine request of a row; ``scored_from``: first prompt position whose logprob counts."""

    token_ids: list[int]
    params: SamplingParams | PoolingParams
    scored_from: int | None = None
    label: str | None = None  # the answer choice this request scores


@dataclass
class RowGroup:
    """A row's requests in flight; the row is finished when every one has an output."""

    subs: list[SubRequest]
    outputs: dict[int, RequestOutput] = field(default_factory=dict)
    key: str | None = None  # its content key, when rows with the same key may share its result

    @property
    def done(self) -> bool:
        return len(self.outputs) == len(self.subs)
