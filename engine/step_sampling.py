"""Sampling a step's logits: forks of ``n`` samples and beams first, then one token per row."""

from __future__ import annotations

import torch

from engine.beam_requests import BeamRequest, BeamRequests
from engine.logprobs import log_softmax, position_logprobs
from engine.model_runner import ModelRunner
from engine.sample_forks import SampleForks
from engine.sequence import Sequence
from engine.stats import EngineStats
from engine.structured_output import StructuredOutputBackend


class StepSampler:
    """A step's sampling rows to tokens. Forked samples join with a copy of their parent's row
    (``SampleForks``); beam rows leave for ``BeamRequests``, which forks and ends beams itself."""

    def __init__(self, runner: ModelRunner, structured: StructuredOutputBackend, forks: SampleForks,
                 beams: BeamRequests, stats: EngineStats, host_bound: set[str]) -> None:
        self.runner, self.structured, self.forks, self.beams, self.stats = runner, structured, forks, beams, stats
        self.host_bound = host_bound  # no request forks, has a grammar or logprobs while it is empty

    def __call__(self, seqs: list[Sequence], logits: torch.Tensor) -> tuple[dict[Sequence, int], list[BeamRequest]]:
        """Each sampling sequence's next token, and the beam searches this step ended."""
        ended: list[BeamRequest] = []
        if self.host_bound:
            seqs, logits = self.forks(seqs, logits)
            if self.beams.requests:
                before = len(seqs)
                seqs, logits, ended = self.beams.step(seqs, logits)
                self.stats.decode_tokens += before - len(seqs)
                if not seqs:
                    return {}, ended
        return dict(zip(seqs, self.sample(seqs, logits), strict=True)), ended

    def sample(self, seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
        """Next tokens under each sequence's grammar and settings; records the logprobs asked for.

        Everything happens where the logits are: grammar bitmasks, log-softmax, sampling; from a
        GPU only token ids and the logprob entries come back, never ``[rows, vocab]``."""
        if not self.host_bound:  # no grammar and no logprobs: no per-sequence look
            return self.runner.sample_tokens(logits, seqs).tolist()
        logits = self.structured.apply_masks(logits, [s.matcher for s in seqs])
        lp_rows = [i for i, s in enumerate(seqs) if s.logprobs is not None]
        raw = log_softmax(logits[lp_rows]) if lp_rows else None  # grammar-masked, before temperature/top-k/top-p
        tokens = self.runner.sample_tokens(logits, seqs).tolist()
        if raw is not None:
            picked = [tokens[i] for i in lp_rows]
            entries = position_logprobs(raw, picked, [seqs[i].params.logprobs for i in lp_rows])
            for i, token, entry in zip(lp_rows, picked, entries, strict=True):
                seqs[i].logprobs.append(entry)
                seqs[i].cumulative_logprob += entry[token].logprob
        return tokens
