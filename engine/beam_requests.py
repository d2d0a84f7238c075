"""Beam-search requests in the step loop: a request's beams are sequences of the scheduler, and
each decided step forks them on shared KV blocks (``engine/beam_search.py`` decides).

A beam that goes on with ``c > 1`` candidates keeps one and forks ``c - 1`` children: they share
its full blocks (reference counts in the BlockManager) and get a copy of its partial last block
(one block copy on the device); a beam no candidate continues is freed. No sequence's KV is ever
copied whole. The beams of a request advance together: a beam whose candidates are in has no
token to compute (the scheduler passes over it) until its siblings' are. If a step finds nothing
to run while such beams hold blocks (a sibling preempted and waiting for room), they are parked:
KV freed, tokens and candidates kept, queued again once the step is decided.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from engine.beam_search import BeamGroup, top_candidates
from engine.outputs import RequestMetrics
from engine.request_intake import RequestIntake
from engine.request_state import RequestState
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus


@dataclass(eq=False)
class BeamRequest:
    state: RequestState
    group: BeamGroup
    first: Sequence  # the beam that computed the prompt: the request's metrics

    def metrics(self, step: int) -> RequestMetrics:
        return RequestMetrics(self.first.num_cached_prompt_tokens, self.group.num_preemptions,
                              self.first.first_scheduled_step, step)


class BeamStep(NamedTuple):
    """A step's rows after the beams took theirs: the other rows, their logits, and the
    requests whose search ended."""

    seqs: list[Sequence]
    logits: torch.Tensor
    ended: list[BeamRequest]


class BeamRequests:
    """The engine's beam-search requests, by id."""

    def __init__(self, scheduler: Scheduler, intake: RequestIntake, eos_token_ids: frozenset[int],
                 copy_blocks: Callable[[list[tuple[int, int]]], None],
                 on_fork: Callable[[int, tuple[int, int] | None], None]) -> None:
        self.scheduler, self.intake, self.eos_token_ids = scheduler, intake, eos_token_ids
        self.copy_blocks, self.on_fork = copy_blocks, on_fork
        self.requests: dict[str, BeamRequest] = {}
        self.parked: set[Sequence] = set()

    def add(self, state: RequestState) -> None:
        """Search for ``state``'s request, whose one sequence so far is its first beam."""
        p, seq = state.params, state.seqs[0]
        eos = (frozenset() if p.ignore_eos else self.eos_token_ids) | frozenset(p.stop_token_ids)
        max_new = self.scheduler.stop.length_limit(seq) - seq.num_prompt_tokens
        group = BeamGroup(p.beam_width, float(p.length_penalty), p.early_stopping, eos, seq.num_prompt_tokens,
                          max_new, [seq])
        self.requests[state.request_id] = BeamRequest(state, group, seq)

    def discard(self, request_id: str) -> None:
        request = self.requests.pop(request_id, None)
        if request is not None:
            self.parked.difference_update(request.group.beams)

    def owns(self, seq: Sequence) -> bool:
        return seq.request_id in self.requests

    def step(self, seqs: list[Sequence], logits: torch.Tensor) -> BeamStep:
        """Take a step's beam rows: record their candidates, decide the steps of the requests
        whose beams are all in (forks, block copies, drops). Returns the other rows and the
        requests whose search ended (no longer held here)."""
        rows = [i for i, s in enumerate(seqs) if s.request_id in self.requests]
        if not rows:
            return BeamStep(seqs, logits, [])
        requests = [self.requests[seqs[i].request_id] for i in rows]
        candidates = top_candidates(logits[rows], [r.group.keep for r in requests])
        for i, request, cand in zip(rows, requests, candidates, strict=True):
            if seqs[i] in request.group.beams:
                request.group.candidates[seqs[i]] = cand
        copies: list[tuple[int, int]] = []
        ended = []
        for request in dict.fromkeys(requests):
            if request.group.ready:
                copies += self._advance(request)
                if request.group.done:
                    ended.append(request)
                    del self.requests[request.state.request_id]
        self.copy_blocks(copies)
        taken = set(rows)
        rest = [i for i in range(len(seqs)) if i not in taken]
        return BeamStep([seqs[i] for i in rest], logits[rest], ended)

    def _advance(self, request: BeamRequest) -> list[tuple[int, int]]:
        """Decide the request's step and apply it; returns the block copies of its forks."""
        group, state = request.group, request.state
        going = group.choose()
        picks: dict[Sequence, list[tuple[int, float]]] = {}
        for parent, token, score in going if not group.done else ():
            picks.setdefault(parent, []).append((token, score))
        for beam in group.beams:
            if beam not in picks:
                self._drop(group, beam)  # first: its blocks may serve the forks' copies
        copies: list[tuple[int, int]] = []
        beams: list[Sequence] = []
        for parent, chosen in picks.items():
            for token, score in chosen[1:]:
                group.num_forks += 1
                child = self.intake.new_sequence(state, group.num_forks)
                child.token_ids = list(parent.token_ids)
                if parent.status is SequenceStatus.RUNNING:
                    pair = self.scheduler.fork(parent, child)
                    self.on_fork(parent.num_computed_tokens // self.scheduler.block_manager.block_size, pair)
                    if pair is not None:
                        copies.append(pair)
                else:  # parked or preempted: it recomputes, from the prefix cache where it can
                    self.scheduler.requeue(child)
                child.token_ids.append(token)
                child.cumulative_logprob = score
                beams.append(child)
            token, score = chosen[0]
            parent.token_ids.append(token)
            parent.cumulative_logprob = score
            if parent in self.parked:
                self.parked.discard(parent)
                self.scheduler.requeue(parent)
            beams.append(parent)
        group.beams = beams
        state.seqs = list(beams)
        return copies

    def _drop(self, group: BeamGroup, beam: Sequence) -> None:
        group.num_preemptions += beam.num_preemptions
        self.parked.discard(beam)
        self.scheduler.abort(beam, "beam")

    def park_idle(self) -> bool:
        """Free the KV of every beam whose candidates are in (it waits for its siblings); True if
        any was parked. For a step that found nothing to run: their blocks let a sibling in."""
        parked = False
        for request in self.requests.values():
            for beam in request.group.candidates:
                if beam not in self.parked:
                    self.scheduler.park(beam)
                    self.parked.add(beam)
                    parked = True
        return parked
