"""ScheduledBatch: one list per field, and the per-sequence view, filter and order built on them."""

from __future__ import annotations

import pytest

from engine.sampling_params import SamplingParams
from engine.scheduled_batch import ScheduledBatch, ScheduledSequence
from engine.sequence import Sequence


def _seqs(n: int) -> list[Sequence]:
    return [Sequence(f"s{i}", [5, 6, 7], SamplingParams(max_tokens=4)) for i in range(n)]


def test_items_are_the_columns_read_row_by_row_and_cannot_be_added_to():
    a, b = _seqs(2)
    items = [ScheduledSequence(a, 1, 3, True), ScheduledSequence(b, 3, 0, False)]
    batch = ScheduledBatch.of(7, items, wants_prompt_logits=True)
    assert (batch.step, batch.wants_prompt_logits, batch.num_decodes, len(batch)) == (7, True, None, 2)
    assert (batch.seqs, batch.num_new_tokens, batch.num_computed_tokens, batch.samples) == (
        [a, b], [1, 3], [3, 0], [True, False])
    assert list(batch.items) == items
    with pytest.raises(AttributeError):
        batch.items.append(items[0])  # would add nothing to the batch
    assert not ScheduledBatch(1) and batch


def test_keep_drops_entries_and_still_counts_the_decodes_in_front():
    a, b, c, d, e = _seqs(5)
    batch = ScheduledBatch.of(1, [ScheduledSequence(a, 1, 4, True), ScheduledSequence(b, 1, 5, True),
                                  ScheduledSequence(c, 1, 6, True), ScheduledSequence(d, 3, 0, True),
                                  ScheduledSequence(e, 2, 0, False)], num_decodes=3)
    batch.keep([True, False, True, False, True])
    assert (batch.seqs, batch.num_new_tokens, batch.num_computed_tokens, batch.samples, batch.num_decodes) == (
        [a, c, e], [1, 1, 2], [4, 6, 0], [True, True, False], 2)
    unordered = ScheduledBatch.of(1, [ScheduledSequence(a, 1, 4, True)])
    unordered.keep([False])
    assert unordered.num_decodes is None and not unordered


def test_decodes_first_is_a_stable_reordered_copy():
    a, b, c, d = _seqs(4)
    items = [ScheduledSequence(a, 3, 0, True), ScheduledSequence(b, 1, 4, True),
             ScheduledSequence(c, 1, 0, False), ScheduledSequence(d, 1, 9, False)]
    batch = ScheduledBatch.of(2, items)
    ordered = batch.decodes_first()
    assert [it.seq for it in ordered.items] == [b, d, a, c]  # one token over a context first
    assert ordered.num_decodes == 2 and list(ordered.items[0]) == list(items[1])
    assert list(batch.items) == items and batch.num_decodes is None  # the batch itself is unchanged
    assert ordered.decodes_first() is ordered
