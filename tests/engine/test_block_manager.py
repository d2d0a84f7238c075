"""BlockManager and Scheduler bookkeeping, without torch or a model."""

import pytest

from engine.block_manager import BlockManager, hash_block
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence


def make_seq(rid: str, tokens: list[int], max_tokens: int = 4) -> Sequence:
    seq = Sequence(rid, tokens, SamplingParams(max_tokens=max_tokens, temperature=0))
    seq.max_total_tokens = len(tokens) + max_tokens
    return seq


def run_prefill(bm: BlockManager, seq: Sequence) -> list[int]:
    cached = bm.find_cached_prefix(seq)
    assert bm.admit(seq, cached, seq.num_tokens - len(cached) * bm.block_size)
    seq.num_computed_tokens = seq.num_tokens
    return cached


def test_allocation_is_on_demand_one_block_per_16_tokens():
    bm = BlockManager(num_blocks=10, block_size=16)
    seq = make_seq("a", list(range(20)))
    run_prefill(bm, seq)
    assert len(seq.block_table) == 2 and bm.num_free_blocks == 8
    for _ in range(12):  # positions 20..31 fit in block 2
        assert bm.allocate_slots(seq, 1)
        seq.token_ids.append(0)
        seq.num_computed_tokens += 1
    assert len(seq.block_table) == 2
    assert bm.allocate_slots(seq, 1)
    assert len(seq.block_table) == 3
    bm.free(seq)
    assert bm.num_free_blocks == 10 and seq.block_table == []


def test_contiguous_allocation_reserves_prompt_plus_max_tokens():
    bm = BlockManager(num_blocks=10, block_size=16, allocation="contiguous")
    seq = make_seq("a", list(range(20)), max_tokens=40)  # 60 tokens -> 4 blocks up front
    run_prefill(bm, seq)
    assert len(seq.block_table) == 4
    assert bm.unfilled_slots(seq) == 64 - 20


def test_hash_chain_reuse_and_ref_counts():
    bm = BlockManager(num_blocks=10, block_size=16)
    shared = list(range(100, 132))  # two full blocks
    a = make_seq("a", shared + [1, 2, 3])
    b = make_seq("b", shared + [7, 8])
    assert run_prefill(bm, a) == []
    cached = run_prefill(bm, b)
    assert cached == a.block_table[:2]
    assert b.block_table[:2] == a.block_table[:2]
    assert [bm.ref_counts[x] for x in a.block_table[:2]] == [2, 2]
    assert b.num_computed_tokens == b.num_tokens


def test_same_tokens_under_a_different_parent_do_not_hit():
    assert hash_block(None, [1, 2]) != hash_block(hash_block(None, [0]), [1, 2])
    bm = BlockManager(num_blocks=10, block_size=4)
    run_prefill(bm, make_seq("a", [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    other = make_seq("b", [9, 9, 9, 9, 5, 6, 7, 8, 9])  # block 2 equal, block 1 not
    assert bm.find_cached_prefix(other) == []


def test_last_token_is_always_recomputed():
    bm = BlockManager(num_blocks=10, block_size=16)
    a = make_seq("a", list(range(32)))
    run_prefill(bm, a)
    b = make_seq("b", list(range(32)))
    assert len(bm.find_cached_prefix(b)) == 1  # 31 tokens may hit: one full block


def test_freed_cached_blocks_are_revived_then_evicted_lru():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = make_seq("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    run_prefill(bm, a)
    a_blocks = list(a.block_table)
    bm.free(a)
    assert bm.num_free_blocks == 4
    b = make_seq("b", [1, 2, 3, 4, 5, 6, 7, 8, 0])
    assert run_prefill(bm, b) == a_blocks[:2]  # revived from the free queue
    bm.free(b)
    # New unrelated request needing all 4 blocks evicts everything, least recently freed first.
    c = make_seq("c", list(range(50, 66)), max_tokens=1)
    run_prefill(bm, c)
    assert bm.hash_to_block == {bm.block_hashes[x]: x for x in c.block_table if bm.block_hashes[x]}
    assert bm.find_cached_prefix(make_seq("d", [1, 2, 3, 4, 5])) == []


def test_eviction_prefers_unhashed_then_tail_blocks():
    bm = BlockManager(num_blocks=6, block_size=4)
    a = make_seq("a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])  # 2 full blocks + 1 partial
    run_prefill(bm, a)
    head, tail, partial = a.block_table
    bm.free(a)
    order = list(bm.free_queue)
    assert order.index(partial) < order.index(tail) < order.index(head)


def test_no_leak_after_every_request_finishes():
    bm = BlockManager(num_blocks=64, block_size=4)
    sched = Scheduler(bm, max_num_seqs=3, max_num_batched_tokens=10)
    seqs = [make_seq(str(i), [5, 6, 7, 8] + list(range(i * 3)) + [1], max_tokens=3) for i in range(8)]
    for s in seqs:
        sched.add(s)
    while sched.has_unfinished():
        batch = sched.schedule()
        sched.update({it.seq: 9 for it in batch.items if it.samples})
    assert bm.num_free_blocks == bm.num_blocks
    assert all(c == 0 for c in bm.ref_counts)


def test_preemption_when_pool_is_full_frees_newest_and_requeues_it_first():
    bm = BlockManager(num_blocks=4, block_size=4)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    a, b = make_seq("a", [1] * 8, max_tokens=8), make_seq("b", [2] * 8, max_tokens=8)
    sched.add(a)
    sched.add(b)
    batch = sched.schedule()
    assert [s.request_id for s in batch.seqs] == ["a", "b"]
    sched.update({s: 3 for s in batch.seqs})
    batch = sched.schedule()  # both need a third block; only "a" gets one
    assert [s.request_id for s in batch.seqs] == ["a"]
    assert batch.preempted == [b] and sched.waiting[0] is b and b.num_computed_tokens == 0
    assert sched.num_preemptions == 1


def test_chunked_prefill_splits_a_long_prompt_under_the_budget():
    bm = BlockManager(num_blocks=64, block_size=4)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=10)
    running = make_seq("r", [1, 2, 3])
    sched.add(running)
    sched.update({it.seq: 4 for it in sched.schedule().items if it.samples})
    long = make_seq("long", list(range(25)))
    sched.add(long)
    chunks = []
    for _ in range(3):
        batch = sched.schedule()
        items = {it.seq.request_id: it.num_new_tokens for it in batch.items}
        assert items["r"] == 1  # the decode is never stalled
        chunks.append(items.get("long"))
        sched.update({it.seq: 4 for it in batch.items if it.samples})
    assert chunks == [9, 9, 7]


def test_static_policy_admits_a_new_cohort_only_when_the_old_one_is_done():
    bm = BlockManager(num_blocks=64, block_size=4)
    sched = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=100, policy="static")
    seqs = [make_seq(str(i), [i + 1] * 3, max_tokens=1 + 2 * (i % 2)) for i in range(4)]
    for s in seqs:
        sched.add(s)
    admitted_per_step = []
    while sched.has_unfinished():
        batch = sched.schedule()
        admitted_per_step.append(sorted(it.seq.request_id for it in batch.items if it.num_new_tokens > 1))
        sched.update({it.seq: 7 for it in batch.items if it.samples})
    # "0" finishes after one token but "2" waits until "1" is done too.
    assert admitted_per_step == [["0", "1"], [], [], ["2", "3"], [], []]


@pytest.mark.parametrize("bad", [dict(num_blocks=0), dict(num_blocks=4, allocation="buddy")])
def test_block_manager_rejects_bad_settings(bad):
    with pytest.raises(ValueError):
        BlockManager(**bad)


def test_sliding_window_gives_back_blocks_behind_the_window_and_they_stay_revivable():
    """Window 20, blocks of 4: a query at position p reads p-19..p, so once 40 tokens are in
    the cache the next query starts at 21 and blocks 0-4 (positions 0-19) go back; a later
    request with the same prefix revives them from the free queue, and a fork and a free
    skip the released entries."""
    from engine.block_manager import RELEASED

    bm = BlockManager(num_blocks=64, block_size=4, window=20)
    seq = make_seq("a", list(range(40)))
    run_prefill(bm, seq)
    assert seq.block_table.count(RELEASED) == 0  # the prompt's own queries still read from position 0
    assert bm.allocate_slots(seq, 1)  # the decode at position 40 reads 21..40
    assert seq.block_table[:5] == [RELEASED] * 5 and RELEASED not in seq.block_table[5:]
    assert bm.num_used_blocks == 11 - 5
    assert bm.find_cached_prefix(make_seq("b", list(range(40)))) == [0, 1, 2, 3, 4, 5, 6, 7, 8]

    child = make_seq("a", list(range(40)))
    seq.num_computed_tokens = 40
    bm.fork(seq, child)
    assert child.block_table[:5] == [RELEASED] * 5 and child.released_blocks == 5
    bm.free(child)
    bm.free(seq)
    assert bm.num_free_blocks == 64 and seq.released_blocks == 0
    assert all(count == 0 for count in bm.ref_counts)


def test_no_window_or_a_contiguous_reservation_keeps_every_block():
    for bm in (BlockManager(num_blocks=64, block_size=4), BlockManager(64, 4, allocation="contiguous", window=20)):
        seq = make_seq("a", list(range(40)))
        run_prefill(bm, seq)
        assert bm.allocate_slots(seq, 1)
        assert -1 not in seq.block_table
