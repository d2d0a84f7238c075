"""``Sequence.slots_ready_until`` lets the scheduler skip ``allocate_slots`` for most decodes.
Skipping must change nothing: the same workload, driven against a block manager that is asked
every step, schedules the same steps and leaves the same blocks, hashes and free queue."""

from __future__ import annotations

import random

import pytest

from engine.block_manager import BlockManager
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus
from engine.stopping import StopConditions

EOS = 2
PLACEHOLDER = -1


class AskedEveryStep(BlockManager):
    """The reference: promises nothing, so every scheduled sequence calls ``allocate_slots``."""

    def _set_slots_ready(self, seq: Sequence) -> None:
        seq.slots_ready_until = 0


def _token(seq: Sequence) -> int:
    """A deterministic next token (EOS now and then), the same in both runs."""
    value = (sum(map(ord, seq.request_id)) * 31 + len(seq.token_ids) * 7) % 41
    return EOS if value == 0 else value + 3


def _check_accounts(batch) -> None:
    """What the runner relies on: decodes (one token over a context) first, counted by
    ``num_decodes`` (an admitted prompt whose prefix hit leaves one token may follow as a
    chunk), and the step's prompt tokens counted once per item."""
    nd = batch.num_decodes
    assert all(it.num_new_tokens == 1 and it.num_computed_tokens > 0 for it in batch.items[:nd])
    assert batch.num_prompt_tokens == sum(
        Scheduler._prompt_tokens(it.seq, it.num_computed_tokens, it.num_new_tokens) for it in batch.items)


def _drive(manager: type[BlockManager], seed: int, window: int | None, allocation: str, overlap: bool,
           budget: int = 20):
    """Run a random workload (shared prefixes, a pool small enough to preempt, chunked prompts);
    returns a trace of every step's schedule and the block manager's state after it."""
    rng = random.Random(seed)
    bm = manager(num_blocks=20, block_size=4, enable_prefix_caching=True, allocation=allocation, window=window)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=budget, stop=StopConditions(frozenset({EOS})))
    prefixes = [[rng.randrange(3, 40) for _ in range(rng.randrange(4, 13))] for _ in range(3)]
    seqs: list[Sequence] = []
    in_flight: list[Sequence] = []
    trace = []
    for step in range(160):
        if step < 120 and rng.random() < 0.35:
            prompt = rng.choice(prefixes) + [rng.randrange(3, 40) for _ in range(rng.randrange(1, 9))]
            seq = Sequence(f"r{len(seqs)}", prompt, SamplingParams(max_tokens=rng.randrange(1, 40), temperature=0))
            seqs.append(seq)
            sched.add(seq)
        batch = sched.schedule()
        _check_accounts(batch)
        samplers = [it.seq for it in batch.items if it.samples]
        if overlap:  # as StepRuns.run overlapped: apply step t after scheduling t + 1
            sched.update({s: _token(s) for s in in_flight if s.status is not SequenceStatus.FINISHED})
            for s in samplers:
                if s.status is not SequenceStatus.FINISHED:
                    s.token_ids.append(PLACEHOLDER)
                    s.num_pending_tokens = 1
            in_flight = samplers
        else:
            sched.update({s: _token(s) for s in samplers})
        trace.append((
            [(it.seq.request_id, it.num_new_tokens, it.num_computed_tokens, it.samples) for it in batch.items],
            [s.request_id for s in batch.preempted],
            sorted(bm.hash_to_block.items()), list(bm.free_queue), list(bm.ref_counts),
            [(s.request_id, s.status, list(s.block_table), s.num_registered_blocks) for s in seqs],
            batch.num_decodes, batch.num_prompt_tokens,
        ))
    return trace, sched, bm


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(("window", "allocation"), [(None, "paged"), (8, "paged"), (None, "contiguous")])
@pytest.mark.parametrize("seed", range(4))
def test_skipping_allocate_slots_changes_nothing(seed, window, allocation, overlap):
    fast, sched, bm = _drive(BlockManager, seed, window, allocation, overlap)
    reference, _, _ = _drive(AskedEveryStep, seed, window, allocation, overlap)
    assert len(fast) == len(reference)
    for step, (got, want) in enumerate(zip(fast, reference, strict=True)):
        assert got == want, f"step {step + 1} differs"
    # the workload reaches preemption (a contiguous reservation admits only what fits whole)
    assert sched.num_preemptions > 0 or allocation == "contiguous"
    assert sum(1 for t in fast if t[0]) > 100


@pytest.mark.parametrize("budget", [3, 5])
def test_a_tight_budget_cuts_prompts_to_single_tokens_that_ride_with_the_decodes(budget):
    """Budgets that leave one token for a prompt chunk: such a chunk counts as a decode (it is
    one token over a context) and its token as a prompt token; ``_check_accounts`` runs on
    every step, and the skipping block manager still matches the one asked every step."""
    fast, _, _ = _drive(BlockManager, 0, None, "paged", False, budget)
    reference, _, _ = _drive(AskedEveryStep, 0, None, "paged", False, budget)
    assert fast == reference
    cut = [it for t in fast for it in t[0][: t[6]] if not it[3]]
    assert cut  # one-token prompt chunks did ride among the decodes


def test_the_promise_covers_every_decode_but_the_one_that_needs_a_block():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = Sequence("a", [5, 6, 7, 8, 9], SamplingParams(max_tokens=20, temperature=0))
    assert bm.admit(seq, [], 5)
    seq.num_computed_tokens = 5
    # two blocks held, the first published: up to 8 tokens need no call
    assert (len(seq.block_table), seq.num_registered_blocks, seq.slots_ready_until) == (2, 1, 8)
    seq.token_ids += [10, 11, 12]
    seq.num_computed_tokens = 7
    assert bm.allocate_slots(seq, 1)  # the 8th token fills the second block: it is the last, not published
    assert (seq.num_registered_blocks, seq.slots_ready_until, len(bm.hash_to_block)) == (1, 8, 1)
    seq.num_computed_tokens = 8
    seq.token_ids.append(13)
    assert bm.allocate_slots(seq, 1)  # the 9th needs a third block; the call publishes the second
    assert (len(seq.block_table), seq.num_registered_blocks, seq.slots_ready_until) == (3, 2, 12)
    assert bm.hash_to_block[seq.block_hashes[1]] == seq.block_table[1]
    bm.free(seq)
    assert seq.slots_ready_until == 0
    unpublished = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    other = Sequence("b", [5, 6, 7, 8, 9], SamplingParams(max_tokens=20, temperature=0))
    assert unpublished.admit(other, [], 5)
    assert other.slots_ready_until == 8  # nothing is published: only the held blocks bound it


def test_a_contiguous_table_still_calls_once_a_block_to_publish():
    """A contiguous reservation never needs a block, so the block to publish bounds the promise."""
    bm = BlockManager(num_blocks=8, block_size=4, allocation="contiguous")
    seq = Sequence("a", [5, 6, 7, 8, 9], SamplingParams(max_tokens=11, temperature=0))
    seq.max_total_tokens = 16
    assert bm.admit(seq, [], 5)
    seq.num_computed_tokens = 5
    assert (len(seq.block_table), seq.num_registered_blocks, seq.slots_ready_until) == (4, 1, 8)
    seq.token_ids += [10, 11, 12, 13]
    seq.num_computed_tokens = 8
    assert bm.allocate_slots(seq, 1)  # a token past the second block publishes it
    assert (len(seq.block_table), seq.num_registered_blocks, seq.slots_ready_until) == (4, 2, 12)


def test_a_block_that_decodes_fill_is_published_once_a_token_past_it_is_scheduled():
    """Synchronous and async (the last token a placeholder) alike: the block that a step's last
    decode fills waits for the next step, which needs the next block and publishes it then."""
    for pending in (0, 1):
        bm = BlockManager(num_blocks=8, block_size=4)
        seq = Sequence("a", list(range(10, 15)), SamplingParams(max_tokens=20, temperature=0))
        assert bm.admit(seq, [], 5)  # the prompt's full block is published, the second holds one prompt token
        seq.num_computed_tokens = 5
        seq.token_ids += [15, 16, 17]
        seq.num_computed_tokens = 8  # decodes filled the second block (no call: the promise covered them)
        assert seq.slots_ready_until == 8 and seq.num_registered_blocks == 1
        seq.token_ids.append(PLACEHOLDER if pending else 18)
        seq.num_pending_tokens = pending
        assert bm.allocate_slots(seq, 1)  # the 9th token needs a third block
        assert seq.num_registered_blocks == 2 and len(bm.hash_to_block) == 2


@pytest.mark.parametrize("same_step", [True, False])
def test_a_prompt_ending_on_a_block_boundary_publishes_all_its_blocks_at_admission(same_step):
    """A one-token request whose prompt fills two blocks finishes before any later call: both of
    its blocks serve a longer prompt that starts with it, in its step or after it finished."""
    bm = BlockManager(num_blocks=64, block_size=16)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=512)
    prompt = list(range(100, 132))
    first = Sequence("a", prompt, SamplingParams(max_tokens=1, temperature=0))
    longer = Sequence("b", prompt + list(range(200, 216)), SamplingParams(max_tokens=4, temperature=0))
    sched.add(first)
    if same_step:
        sched.add(longer)
    batch = sched.schedule()
    assert len(bm.hash_to_block) == (3 if same_step else 2)
    sched.update({it.seq: 7 for it in batch.items if it.samples})
    assert first.is_finished
    if not same_step:
        sched.add(longer)
        sched.schedule()
    assert longer.num_cached_prompt_tokens == 32


@pytest.mark.parametrize("overlap", [False, True])
def test_a_sequence_ending_as_its_decodes_fill_a_block_publishes_it(overlap):
    """Its last decode fills a block and it stops (synchronous: at ``update``; async: drained at
    its length limit while that token is in flight): no later call would publish the block, so
    ending does, and a prompt that continues its text hits both blocks."""
    bm = BlockManager(num_blocks=32, block_size=4)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    first = Sequence("a", [10, 11, 12, 13], SamplingParams(max_tokens=5, temperature=0))
    sched.add(first)
    tokens = iter([20, 21, 22, 23, 24])
    in_flight: list[Sequence] = []
    in_flight_token = 0
    for _ in range(7):
        batch = sched.schedule()
        sampling = [s for s, samples in zip(batch.seqs, batch.samples, strict=True) if samples]
        if not overlap:
            sched.update({s: next(tokens) for s in sampling})
            continue
        if in_flight:  # the step before lands after this one is scheduled
            sched.update({s: in_flight_token for s in in_flight if not s.is_finished})
        in_flight = [s for s in sampling if not s.is_finished]
        in_flight_token = next(tokens, 99)
        for s in in_flight:
            s.token_ids.append(PLACEHOLDER)
            s.num_pending_tokens = 1
    assert first.is_finished and first.output_token_ids == [20, 21, 22, 23, 24]
    assert len(bm.hash_to_block) == 2  # the prompt's block and the one decodes filled
    longer = Sequence("b", [10, 11, 12, 13, 20, 21, 22, 23, 30, 31], SamplingParams(max_tokens=2, temperature=0))
    sched.add(longer)
    sched.schedule()
    assert longer.num_cached_prompt_tokens == 8
