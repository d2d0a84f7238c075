"""Beam search's rule for one step: from the next-token candidates of a request's beams, which
beams go on and which hypotheses are finished, exactly as HF transformers' ``generate(num_beams=k,
do_sample=False)`` decides it (``GenerationMixin._beam_search`` of transformers 5).

Per step, with ``g`` output tokens so far and ``K = max(2, 1 + number of EOS ids) * k``:

- every beam's log-softmax (float32, of the raw logits) plus the beam's running score (the sum
  of its tokens' logprobs, in float32) scores each (beam, token); the ``K`` best over all beams
  are the candidates, best first;
- a candidate whose token is an EOS id, or that reaches the length limit, is *finished*. Of the
  first ``k`` candidates, each finished one becomes a hypothesis scored
  ``score / (g + 1) ** length_penalty`` (output tokens only, the EOS included), and the ``k``
  best hypotheses are kept;
- the ``k`` best unfinished candidates are the next beams;
- the search ends when every candidate is finished (the length limit), when ``early_stopping``
  is True and ``k`` hypotheses are in, or when no beam can beat the worst of ``k`` hypotheses:
  the best beam's score over ``g ** length_penalty`` (over ``max_tokens ** length_penalty`` with
  ``early_stopping="never"`` and a positive penalty) is not above it.

Plain torch on a few numbers per beam: the candidates of a beam are its ``K`` best tokens
(the global ``K`` best are always among them), so a beam whose siblings are not computed yet
keeps ``K`` values, not a vocabulary of logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.sequence import Sequence


@dataclass
class Hypothesis:
    """A finished beam."""

    token_ids: list[int]  # output tokens, the EOS that ended it included
    score: float  # sum_logprobs / len(token_ids) ** length_penalty: HF's ``sequences_scores``
    sum_logprobs: float
    finish_reason: str  # "stop" (an EOS or stop token id) or "length"


@dataclass(eq=False)
class BeamGroup:
    """The beam search of one request. ``beams`` are its live sequences, all of the same length;
    a beam's running score is its ``cumulative_logprob``."""

    width: int
    length_penalty: float
    early_stopping: bool | str
    eos: frozenset[int]
    prompt_len: int
    max_new_tokens: int  # the length limit, in output tokens
    beams: list[Sequence]
    # a beam's K best next tokens (logprob values, token ids), once its step computed them
    candidates: dict[Sequence, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    finished: list[Hypothesis] = field(default_factory=list)  # best first, at most ``width``
    improvable: bool = True  # HF's early-stop heuristic: a beam may still beat the hypotheses
    done: bool = False
    num_forks: int = 0
    num_preemptions: int = 0  # of the beams already dropped

    @property
    def keep(self) -> int:
        """Candidates per step (HF's ``beams_to_keep``): enough that ``width`` go on even if
        every beam's best token is an EOS id."""
        return max(2, 1 + len(self.eos)) * self.width

    @property
    def ready(self) -> bool:
        """Every live beam has its candidates: the step can be decided."""
        return len(self.candidates) == len(self.beams)

    def choose(self) -> list[tuple[Sequence, int, float]]:
        """Decide one step from the candidates (``ready``): record the finished hypotheses and
        return the beams that go on as (parent beam, next token, running score), best first;
        sets ``done`` when the search is over."""
        k, lp = self.width, self.length_penalty
        scores = torch.tensor([b.cumulative_logprob for b in self.beams], dtype=torch.float32)
        per_beam = [self.candidates[b] for b in self.beams]
        values = torch.cat([v.float() + scores[i] for i, (v, _) in enumerate(per_beam)])
        ids = torch.cat([t for _, t in per_beam])
        top = torch.topk(values, min(self.keep, values.numel()))
        parents = (top.indices // len(per_beam[0][0])).tolist()  # every beam has as many candidates
        tokens = ids[top.indices].tolist()
        g = self.beams[0].num_output_tokens + 1  # output tokens once this step's token is in
        at_limit = g >= self.max_new_tokens
        ends = [at_limit or t in self.eos for t in tokens]
        totals = top.values.tolist()
        self.candidates.clear()
        full = len(self.finished) == k
        if self.improvable and not (full and self.early_stopping is True):
            normed = (top.values / (g**lp)).tolist()
            for c in range(min(k, len(tokens))):
                if ends[c]:
                    beam = self.beams[parents[c]]
                    reason = "stop" if tokens[c] in self.eos else "length"
                    self.finished.append(Hypothesis(beam.output_token_ids + [tokens[c]], normed[c], totals[c], reason))
            self.finished.sort(key=lambda h: -h.score)
            del self.finished[k:]
        going = [(self.beams[parents[c]], tokens[c], totals[c]) for c in range(len(tokens)) if not ends[c]][:k]
        if going:
            self._check_improvable(going[0][2], g)
        full = len(self.finished) == k
        self.done = not going or not self.improvable or (full and self.early_stopping is True)
        return going

    def _check_improvable(self, best_running: float, g: int) -> None:
        """HF's ``_check_early_stop_heuristic``: can the best beam still beat the worst of ``k``
        hypotheses (never, with fewer than ``k`` in: their empty places score -1e9)."""
        never = self.early_stopping == "never" and self.length_penalty > 0.0
        length = self.max_new_tokens if never else g
        best = (torch.tensor(best_running, dtype=torch.float32) / (length**self.length_penalty)).item()
        worst = self.finished[-1].score if len(self.finished) == self.width else -1.0e9
        self.improvable = self.improvable and best > worst


def top_candidates(logits: torch.Tensor, keep: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each row's ``keep[i]`` best tokens by log-softmax of its float32 logits (values, ids), on
    the host."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    top = torch.topk(logprobs, min(max(keep), logprobs.shape[-1]), dim=-1)
    values, ids = top.values.cpu(), top.indices.cpu()
    return [(values[i, :n], ids[i, :n]) for i, n in enumerate(keep)]
