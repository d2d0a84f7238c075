"""The runner's persistent block tables give, every step, exactly the table a rebuild from the
sequences' lists would: appended entries, rewritten tables, finished rows taken back, growth."""

from __future__ import annotations

import random

import numpy as np

from engine.block_manager import RELEASED, BlockManager
from engine.block_table_rows import BlockTableRows
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence, SequenceStatus


def rebuilt(seqs: list[Sequence], width: int) -> np.ndarray:
    table = np.zeros((len(seqs), width), np.int64)
    for i, s in enumerate(seqs):
        blocks = s.block_table[:width]
        table[i, : len(blocks)] = blocks
    return table


def step(rows: BlockTableRows, seqs: list[Sequence], width: int | None = None) -> np.ndarray:
    width = width or max(1, max(len(s.block_table) for s in seqs))
    return rows.gather(rows.rows_for(seqs), width)


def seq(i: int) -> Sequence:
    return Sequence(f"r{i}", [1, 2, 3], SamplingParams())


def _change_one(rng: random.Random, live: list[Sequence], born: int) -> int:
    """One thing the block manager or the scheduler does to a sequence; returns ``born``."""
    s = rng.choice(live)
    action = rng.random()
    if action < 0.4:
        s.block_table.append(rng.randrange(1000))  # a decode crossing into a new block
    elif action < 0.5:
        s.block_table += [rng.randrange(1000) for _ in range(rng.randrange(2, 6))]  # a prompt chunk
    elif action < 0.6:
        s.block_table = []  # preempted: freed
        s.block_table_version += 1
    elif action < 0.7:
        s.block_table = [rng.randrange(1000) for _ in range(rng.randrange(1, 9))]  # admitted again
        s.block_table_version += 1
    elif action < 0.75 and s.block_table:
        s.block_table[0] = RELEASED  # out of the sliding window, in place
        s.block_table_version += 1
    elif action < 0.85 and len(live) > 1:
        s.status = SequenceStatus.FINISHED
        live.remove(s)
    else:
        live.append(seq(born))
        born += 1
    return born


def test_a_random_life_of_sequences_matches_rebuilding_every_step():
    rng = random.Random(0)
    rows = BlockTableRows(max_blocks_per_seq=4, rows=2)  # small: growth and widening both happen
    live = [seq(i) for i in range(3)]
    born = 3
    for _ in range(400):
        for _ in range(rng.randrange(1, 4)):  # several sequences change in one step
            born = _change_one(rng, live, born)
        batch = [x for x in live if x.block_table and rng.random() < 0.8] or [x for x in live if x.block_table]
        if batch:
            width = max(len(x.block_table) for x in batch)
            assert np.array_equal(step(rows, batch, width), rebuilt(batch, width))
            shorter = max(1, width - 2)  # the step needs fewer blocks than some rows hold
            assert np.array_equal(step(rows, batch, shorter), rebuilt(batch, shorter))
    assert len(rows.owner) <= 2 * (len(live) + 8)  # finished rows were taken back, not leaked


def test_a_finished_sequences_row_goes_to_the_next_sequence_clean():
    rows = BlockTableRows(max_blocks_per_seq=8, rows=1)
    a = seq(0)
    a.block_table = [5, 6, 7]
    assert step(rows, [a]).tolist() == [[5, 6, 7]]
    a.status = SequenceStatus.FINISHED
    b = seq(1)
    b.block_table = [9]
    assert step(rows, [b], 3).tolist() == [[9, 0, 0]]  # a's blocks do not show through
    assert b.table_row == 0 and a.table_row == -1 and len(rows.owner) == 1


def test_the_block_managers_changes_reach_the_rows():
    """Admit, decode, fork, a sliding-window release and free, through the real block manager."""
    bm = BlockManager(num_blocks=32, block_size=4, enable_prefix_caching=False, window=8)
    rows = BlockTableRows(max_blocks_per_seq=16)
    parent = Sequence("p", list(range(10)), SamplingParams())
    assert bm.admit(parent, [], 10)
    parent.num_computed_tokens = 10
    assert np.array_equal(step(rows, [parent]), rebuilt([parent], 3))
    for _ in range(12):  # decodes: new blocks, and the window lets the first ones go
        parent.token_ids.append(1)
        assert bm.allocate_slots(parent, 1)
        parent.num_computed_tokens += 1
        width = len(parent.block_table)
        assert np.array_equal(step(rows, [parent], width), rebuilt([parent], width))
    assert RELEASED in parent.block_table
    child = Sequence("p", list(range(10)), SamplingParams(), sample_index=1)
    bm.fork(parent, child)
    both = [parent, child]
    width = max(len(s.block_table) for s in both)
    assert np.array_equal(step(rows, both, width), rebuilt(both, width))
    bm.free(parent)
    assert bm.admit(parent, [], 3)
    assert np.array_equal(step(rows, both, width), rebuilt(both, width))
