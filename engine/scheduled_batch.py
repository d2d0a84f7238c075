"""One step's work as the scheduler hands it to the model runner.

The batch keeps one list per field (sequences, new tokens, computed tokens, whether each
samples) rather than one object per sequence: at 1,024 sequences, building a named tuple per
sequence took about 150 µs a step and transposing them back into columns for the runner
another 50-80 µs. ``items`` gives the per-sequence view where a caller wants one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from itertools import compress
from typing import NamedTuple

from engine.sequence import Sequence


class ScheduledSequence(NamedTuple):
    """One sequence's share of a step: its next ``num_new_tokens`` tokens, starting after the
    ``num_computed_tokens`` already in the KV cache. ``samples``: the step reaches its last
    token, so its logits pick the next one (a prompt chunk short of the end does not)."""

    seq: Sequence
    num_new_tokens: int
    num_computed_tokens: int
    samples: bool


def is_decode(num_new_tokens: int, num_computed_tokens: int) -> bool:
    """A single-token step over a context: what backends batch as decodes."""
    return num_new_tokens == 1 and num_computed_tokens > 0


@dataclass
class ScheduledBatch:
    """One step's work in batch order, what the model runner consumes. ``schedule()`` has
    already counted its tokens as computed (as vLLM v1 does), so everything after the forward
    pass sees the step's result; the runner reads where each sequence starts from
    ``num_computed_tokens``. Entry ``i`` of the four lists is one sequence's share."""

    step: int
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    samples: list[bool] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    wants_prompt_logits: bool = False  # some sequence asks for prompt logprobs in this chunk
    wants_hidden: bool = False  # some sequence pools hidden states (an embedding request)
    num_prompt_tokens: int = 0  # tokens of this step that (re)compute a prompt or a preempted output
    # the first num_decodes entries are decodes (the scheduler puts them first); None: entries in
    # any order (the runner sorts them)
    num_decodes: int | None = None

    @classmethod
    def of(cls, step: int, items: Iterable[ScheduledSequence], **fields) -> ScheduledBatch:
        """A batch of these items, in this order (``num_decodes`` unknown unless given)."""
        batch = cls(step, **fields)
        for item in items:
            batch.append(item)
        return batch

    def append(self, item: ScheduledSequence) -> None:
        seq, num_new, computed, samples = item
        self.seqs.append(seq)
        self.num_new_tokens.append(num_new)
        self.num_computed_tokens.append(computed)
        self.samples.append(samples)

    @property
    def items(self) -> tuple[ScheduledSequence, ...]:
        """The per-sequence view, built on each read (not on the step's hot path); a tuple, since
        adding to it would not add to the batch (``append`` does)."""
        columns = (self.seqs, self.num_new_tokens, self.num_computed_tokens, self.samples)
        return tuple(ScheduledSequence(*entry) for entry in zip(*columns, strict=True))

    def keep(self, mask: list[bool]) -> None:
        """Drop the entries whose ``mask`` is False; the decodes stay first and counted."""
        if self.num_decodes is not None:
            self.num_decodes = sum(mask[: self.num_decodes])
        self.seqs = list(compress(self.seqs, mask))
        self.num_new_tokens = list(compress(self.num_new_tokens, mask))
        self.num_computed_tokens = list(compress(self.num_computed_tokens, mask))
        self.samples = list(compress(self.samples, mask))

    def decodes_first(self) -> ScheduledBatch:
        """This batch if its decodes are known to come first; else a copy ordered so (a stable
        sort), with them counted."""
        if self.num_decodes is not None:
            return self
        decode = [is_decode(q, c) for q, c in zip(self.num_new_tokens, self.num_computed_tokens, strict=True)]
        order = sorted(range(len(self.seqs)), key=lambda i: not decode[i])
        return replace(
            self, seqs=[self.seqs[i] for i in order], num_new_tokens=[self.num_new_tokens[i] for i in order],
            num_computed_tokens=[self.num_computed_tokens[i] for i in order],
            samples=[self.samples[i] for i in order], num_decodes=sum(decode),
        )

    def __len__(self) -> int:
        return len(self.seqs)

    def __bool__(self) -> bool:
        return bool(self.seqs)
