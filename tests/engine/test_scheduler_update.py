"""Scheduler.update, a step's post-processing (append, stop, finish, free), without torch or a model."""

from __future__ import annotations

import subprocess
import sys

from engine.block_manager import BlockManager
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus
from engine.stopping import StopConditions

EOS = 2


def make_seq(rid: str, tokens: list[int], **params) -> Sequence:
    p = SamplingParams(**({"max_tokens": 4, "temperature": 0} | params))
    seq = Sequence(rid, tokens, p)
    seq.max_total_tokens = len(tokens) + p.max_tokens
    return seq


def scheduler(num_blocks: int = 32, **stop) -> Scheduler:
    bm = BlockManager(num_blocks=num_blocks, block_size=4)
    return Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=64, stop=StopConditions(**stop))


def run_step(sched: Scheduler, tokens: dict[str, int]) -> list[Sequence]:
    """Schedule one step and sample ``tokens[request_id]`` for every sequence that samples."""
    batch = sched.schedule()
    return sched.update({it.seq: tokens[it.seq.request_id] for it in batch.items if it.samples})


def test_schedule_counts_the_step_as_computed_and_says_who_samples():
    sched = scheduler()
    sched.max_num_batched_tokens = 7
    a, b = make_seq("a", [1] * 5), make_seq("b", [2] * 6)
    sched.add(a)
    sched.add(b)
    batch = sched.schedule()
    assert [(it.seq, it.num_new_tokens, it.num_computed_tokens, it.samples) for it in batch.items] == [
        (a, 5, 0, True), (b, 2, 0, False)  # b's prompt is chunked: no logits to sample from yet
    ]
    assert a.num_computed_tokens == 5 and b.num_computed_tokens == 2
    assert not batch.wants_prompt_logits  # the runner skips its prompt-logprob pass
    c = make_seq("c", [3] * 4, prompt_logprobs=0)
    sched.add(c)
    sched.update({a: 9})
    assert sched.schedule().wants_prompt_logits


def test_update_appends_the_token_and_the_sequence_keeps_running():
    sched = scheduler()
    a = make_seq("a", [1, 2, 3])
    sched.add(a)
    assert run_step(sched, {"a": 7}) == []
    assert a.output_token_ids == [7] and a.num_computed_tokens == 3 and a.num_uncomputed_tokens == 1
    batch = sched.schedule()
    assert [(it.num_new_tokens, it.num_computed_tokens, it.samples) for it in batch.items] == [(1, 3, True)]
    assert sched.update({a: 8}) == [] and a.output_token_ids == [7, 8] and sched.running == [a]


def test_eos_stops_unless_ignored():
    sched = scheduler(eos_token_ids=frozenset({EOS}))
    a, b = make_seq("a", [5, 6]), make_seq("b", [5, 6], ignore_eos=True)
    sched.add(a)
    sched.add(b)
    assert run_step(sched, {"a": EOS, "b": EOS}) == [a]
    assert a.finish_reason == "stop" and a.status is SequenceStatus.FINISHED and a.output_token_ids == [EOS]
    assert sched.running == [b]


def test_max_tokens_and_the_context_end_with_length():
    sched = scheduler(max_model_len=5)
    a, b = make_seq("a", [1], max_tokens=2), make_seq("b", [1, 2, 3], max_tokens=10)
    sched.add(a)
    sched.add(b)
    assert run_step(sched, {"a": 9, "b": 9}) == []
    assert run_step(sched, {"a": 9, "b": 9}) == [a, b]  # a: 2 outputs; b: 5 tokens fill the context
    assert a.finish_reason == b.finish_reason == "length"
    assert [a.num_output_tokens, b.num_tokens] == [2, 5]


def test_a_stop_token_stops_and_is_kept_in_the_output():
    sched = scheduler()
    a = make_seq("a", [1, 2], stop_token_ids=[42], max_tokens=10)
    sched.add(a)
    run_step(sched, {"a": 41})
    assert run_step(sched, {"a": 42}) == [a]
    assert a.finish_reason == "stop" and a.output_token_ids == [41, 42]


def test_stop_strings_are_asked_only_for_requests_that_have_them():
    asked = []

    def find(seq: Sequence) -> int | None:
        asked.append(seq.request_id)
        return 3 if seq.output_token_ids[-1] == 50 else None

    sched = scheduler(find_stop_string=find)
    a, b = make_seq("a", [1], stop=["xyz"], max_tokens=10), make_seq("b", [1], max_tokens=10)
    sched.add(a)
    sched.add(b)
    run_step(sched, {"a": 49, "b": 50})
    assert run_step(sched, {"a": 50, "b": 50}) == [a]
    assert asked == ["a", "a"] and a.stop_text_end == 3 and a.finish_reason == "stop"
    assert b.stop_text_end is None and not b.is_finished


def test_finishing_frees_the_blocks_and_leaves_the_prefix_cached():
    sched = scheduler(num_blocks=8)
    bm = sched.block_manager
    a = make_seq("a", list(range(10)), max_tokens=1)
    sched.add(a)
    batch = sched.schedule()
    held = list(a.block_table)
    assert len(held) == 3 and bm.num_free_blocks == 5
    assert sched.update({a: 9}) == [a]
    assert a.block_table == [] and bm.num_free_blocks == 8 and all(c == 0 for c in bm.ref_counts)
    assert sched.running == [] and not sched.has_unfinished() and a.finished_step == batch.step
    again = make_seq("again", list(range(10)))
    assert bm.find_cached_prefix(again) == held[:2]  # two full blocks stay reusable


def test_preempted_sequence_keeps_its_tokens_and_resumes_by_recomputing_them():
    sched = scheduler(num_blocks=4)  # 16 token slots
    a, b = make_seq("a", [1] * 8, max_tokens=8), make_seq("b", [2] * 8, max_tokens=8)
    sched.add(a)
    sched.add(b)
    run_step(sched, {"a": 3, "b": 4})  # two full blocks each, and a ninth token to compute
    batch = sched.schedule()  # both need a third block: b, the newest, gives its blocks back
    assert batch.preempted == [b] and batch.seqs == [a]
    assert b.status is SequenceStatus.PREEMPTED and b.num_computed_tokens == 0 and b.block_table == []
    assert b.output_token_ids == [4]
    assert sched.update({a: 5}) == []  # b did not run: nothing sampled for it
    assert b.output_token_ids == [4] and a.output_token_ids == [3, 5]
    while a in sched.running:
        batch = sched.schedule()
        assert b not in batch.seqs  # no room while a holds its blocks
        sched.update({it.seq: 6 for it in batch.items if it.samples})
    assert a.finish_reason == "length"
    batch = sched.schedule()  # a's blocks are free: b recomputes prompt and output in one go
    assert [(it.seq, it.num_new_tokens, it.num_computed_tokens, it.samples) for it in batch.items] == [
        (b, 9, 0, True)
    ]
    assert sched.update({b: 7}) == [] and b.output_token_ids == [4, 7] and b.num_preemptions == 1

def test_scheduler_and_block_manager_need_no_torch():
    code = (
        "import sys, engine.scheduler, engine.block_manager, engine.stopping; "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def _pending(seq: Sequence) -> None:
    """What the async engine does after launching a step in which ``seq`` samples."""
    seq.token_ids.append(-1)
    seq.num_pending_tokens = 1


def test_a_sequence_whose_token_in_flight_ends_it_frees_its_slot_at_once():
    """Async scheduling: a token in flight that reaches max_tokens is known to end the sequence,
    so the next schedule neither runs it past its end nor keeps its slot and blocks from the queue."""
    sched = scheduler(num_blocks=4)
    sched.max_num_seqs = 1
    a, b = make_seq("a", [1] * 3, max_tokens=1), make_seq("b", [2] * 3)
    sched.add(a)
    sched.add(b)
    assert [it.seq for it in sched.schedule().items] == [a]
    _pending(a)
    batch = sched.schedule()
    assert [it.seq for it in batch.items] == [b]  # admitted in a's place
    assert a.status is SequenceStatus.DRAINING and a.block_table == [] and a not in sched.running
    assert sched.update({a: 7, b: 8}) == [a]
    assert a.token_ids == [1, 1, 1, 7] and a.finish_reason == "length" and a.status is SequenceStatus.FINISHED
    assert sched.running == [b]


def test_a_sequence_preempted_while_its_stop_token_is_in_flight_finishes_from_the_queue():
    sched = scheduler(eos_token_ids=frozenset({EOS}))
    a = make_seq("a", [1] * 3)
    sched.add(a)
    sched.schedule()
    _pending(a)
    sched.preempt(a)
    assert a in sched.waiting and sched.schedule().items == ()  # not admitted before its token lands
    assert sched.update({a: EOS}) == [a]
    assert a.finish_reason == "stop" and a not in sched.waiting and not sched.has_unfinished()


def test_a_sequence_entering_stores_the_tokens_that_can_end_it_when_only_they_can():
    """``ending_token_ids`` lets update decide most tokens without finish_reason; any other stop
    (grammar, stop token ids, stop strings) leaves it None so that every token is asked."""
    sched = scheduler(eos_token_ids=frozenset({EOS, 3}))
    plain, ignoring = make_seq("a", [1]), make_seq("b", [1], ignore_eos=True)
    stop_ids, stop_text = make_seq("c", [1], stop_token_ids=[9]), make_seq("d", [1], stop=["x"])
    grammar = make_seq("e", [1])
    grammar.matcher = object()  # what intake sets for a structured-output request
    for seq in (plain, ignoring, stop_ids, stop_text, grammar):
        sched.add(seq)
    assert [s.ending_token_ids for s in (plain, ignoring, stop_ids, stop_text, grammar)] == [
        frozenset({EOS, 3}), frozenset(), None, None, None]
    assert plain.max_total_tokens == 5


def test_update_stops_the_same_sequences_with_and_without_the_stored_ending_tokens():
    """Differential: the same random steps through update's shortcut and through finish_reason
    for every token stop the same sequences at the same step for the same reason."""
    import random

    runs = []
    for shortcut in (True, False):
        sched = scheduler(num_blocks=400, eos_token_ids=frozenset({EOS, 7}), max_model_len=30)
        sched.max_num_seqs = 40
        seqs = []
        for i in range(40):
            r = random.Random(i)
            params = {"max_tokens": r.randrange(1, 20), "ignore_eos": r.random() < 0.3}
            if r.random() < 0.2:
                params["stop_token_ids"] = [r.randrange(3, 12)]
            seqs.append(make_seq(str(i), [1] * r.randrange(1, 12), **params))
            sched.add(seqs[-1])
            if not shortcut:
                seqs[-1].ending_token_ids = None
        tokens = random.Random(5)
        for _ in range(100):  # every sequence reaches its length well before (a lost length check: fail, not hang)
            batch = sched.schedule()
            sched.update({it.seq: tokens.randrange(2, 12) for it in batch.items if it.samples})
        assert not sched.has_unfinished()
        runs.append([(s.finish_reason, s.finished_step, s.output_token_ids) for s in seqs])
    assert runs[0] == runs[1]
    assert {r for r, _, _ in runs[0]} == {"stop", "length"}
