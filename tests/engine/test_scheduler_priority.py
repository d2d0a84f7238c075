"""The scheduler's priorities, without torch: a lower number is admitted first and preempted last
(the live routes' requests, -1, ahead of the jobs sharing their engine, 0)."""

from __future__ import annotations

import subprocess
import sys

from engine.block_manager import BlockManager
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus

LIVE, JOB = -1, 0


def make_seq(rid: str, tokens: list[int], priority: int = JOB, max_tokens: int = 8) -> Sequence:
    seq = Sequence(rid, tokens, SamplingParams(max_tokens=max_tokens, temperature=0), priority=priority)
    seq.max_total_tokens = len(tokens) + max_tokens
    return seq


def scheduler(num_blocks: int = 64, max_num_seqs: int = 8) -> Scheduler:
    return Scheduler(BlockManager(num_blocks=num_blocks, block_size=4), max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=64)


def step(sched: Scheduler) -> list[str]:
    """One step, every sampling sequence sampling token 9; the ids of the sequences it ran."""
    batch = sched.schedule()
    sched.update({it.seq: 9 for it in batch.items if it.samples})
    return [it.seq.request_id for it in batch.items]


def test_a_live_request_waits_ahead_of_the_queued_job_rows():
    sched = scheduler(max_num_seqs=2)
    jobs = [make_seq(f"j{i}", [1, 2, 3]) for i in range(4)]
    for seq in jobs:
        sched.add(seq)
    assert step(sched) == ["j0", "j1"]  # the batch is full: j2, j3 wait
    live = make_seq("live", [5, 6], LIVE)
    sched.add(live)
    assert [s.request_id for s in sched.waiting] == ["live", "j2", "j3"]
    sched.finish(jobs[0], "stop")  # the first free slot goes to the live request
    assert "live" in step(sched)
    assert [s.request_id for s in sched.running] == ["live", "j1"]  # in front: scheduled first
    assert [s.request_id for s in sched.waiting] == ["j2", "j3"]


def test_live_requests_keep_their_arrival_order_among_themselves():
    sched = scheduler()
    for rid, priority in (("j0", JOB), ("a", LIVE), ("j1", JOB), ("b", LIVE)):
        sched.add(make_seq(rid, [1, 2], priority))
    assert [s.request_id for s in sched.waiting] == ["a", "b", "j0", "j1"]


def test_a_full_pool_preempts_job_rows_never_the_live_request():
    # 6 blocks of 4 slots: three 7-token prompts take 2 blocks each; growing needs a third
    sched = scheduler(num_blocks=6)
    job_a, live, job_b = make_seq("ja", [1] * 7), make_seq("live", [2] * 7, LIVE), make_seq("jb", [3] * 7)
    for seq in (job_a, job_b):
        sched.add(seq)
    sched.add(live)
    assert step(sched) == ["live", "ja", "jb"]  # the three prompts: 7 tokens each, 6 blocks in use
    assert [s.request_id for s in sched.running] == ["live", "ja", "jb"]  # the live one in front
    assert step(sched) == ["live", "ja", "jb"]  # token 8 of each fits in its second block
    assert step(sched) == ["live", "ja"]  # token 9 needs a block: the last job row gives its two
    assert live.status is SequenceStatus.RUNNING and live.num_preemptions == 0
    assert job_b.num_preemptions == 1 and sched.num_preemptions == 1
    # a preempted job row queues first among the job rows, behind any live request
    sched.add(make_seq("late-job", [4, 4]))
    sched.add(make_seq("late-live", [5, 5], LIVE))
    assert [s.request_id for s in sched.waiting] == ["late-live", "jb", "late-job"]


def test_one_priority_is_first_come_first_served():
    sched = scheduler(num_blocks=6)
    seqs = [make_seq(f"s{i}", [i + 1] * 7) for i in range(3)]
    for seq in seqs:
        sched.add(seq)
    step(sched)
    step(sched)
    step(sched)
    assert seqs[2].num_preemptions == 1 and seqs[0].num_preemptions == 0  # the last admitted goes first
    assert sched.waiting[0] is seqs[2]


def test_the_scheduler_imports_no_torch():
    code = "import sys, engine.scheduler, engine.block_manager; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
