"""A row's content key: everything its computed result depends on, so an unchanged row is
never computed twice (issue 28).

The key is a SHA-256 over the plan's kind, request mode and mode options, the engine fields
that shape outputs (model, dtype, context length), and each of the row's engine requests:
prompt token ids (the template, the document and any truncation are in them), sampling
parameters, and what is scored. Ids, passthrough fields and row stages are not in it: a reused
or shared result is rebuilt into each row with its own id and fields, and the row stage runs
on it again. Every part stores its rows' keys (column ``content_key``), so a re-run of a
changed shard takes the unchanged rows from the previous part.

Within a run, rows with the same key are computed once only when that is the same
computation: greedy, or seeded (the seed is in the key). Unseeded sampling draws each row
anew, so such rows are never shared within a run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from engine.sampling_params import SamplingParams
from pipeline.plan import JobPlan
from pipeline.sub_requests import SubRequest

_ENGINE_FIELDS = ("model", "dtype", "max_model_len")


class ContentKeys:
    """``key(subs)`` for one plan: the plan's share of the key is hashed once."""

    def __init__(self, plan: JobPlan) -> None:
        head = {"kind": plan.kind, "request_mode": plan.request_mode, "mode_options": plan.mode_options,
                "engine": {k: plan.engine_settings.get(k) for k in _ENGINE_FIELDS}}
        self._head = hashlib.sha256(json.dumps(head, sort_keys=True, default=str).encode())

    def key(self, subs: list[SubRequest]) -> str:
        digest = self._head.copy()
        for sub in subs:
            params = dataclasses.asdict(sub.params)
            digest.update(json.dumps([sub.token_ids, params, sub.scored_from, sub.label], sort_keys=True,
                                     default=str).encode())
        return digest.hexdigest()[:32]


def shareable(subs: list[SubRequest]) -> bool:
    """Whether two rows with these requests get the same result: greedy, or seeded."""
    return all(not isinstance(s.params, SamplingParams) or s.params.greedy or s.params.seed is not None
               for s in subs)  # (an embedding is computed the same every time)
