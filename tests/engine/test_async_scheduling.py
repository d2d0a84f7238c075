"""Async scheduling: step t+1 is scheduled and launched before step t's tokens are read, and every
output stays exactly what the synchronous engine gives (greedy equality with HF in every engine
mode is in test_engine_matches_hf.py)."""

from __future__ import annotations

import functools

import pytest
from engine_cases import random_prompts

from engine import LLM, SamplingParams
from engine.block_manager import BlockManager
from engine.sequence import Sequence
from engine.step_inputs import PLACEHOLDER
from engine.structured_output import StructuredOutput


def tiny(tiny_model_dir, async_scheduling: bool, **kw) -> LLM:
    return LLM(str(tiny_model_dir), **(dict(num_kv_blocks=96, max_num_seqs=8, async_scheduling=async_scheduling) | kw))


def same_outputs(got, want) -> None:
    """Tokens, reasons and which alternatives exactly; logprobs to 1e-4 (a step of another shape
    rounds float32 sums differently)."""
    approx = functools.partial(pytest.approx, abs=1e-4)
    for g, w in zip(got, want, strict=True):
        assert (g.request_id, g.error, len(g.outputs)) == (w.request_id, w.error, len(w.outputs))
        for a, b in zip(g.outputs, w.outputs, strict=True):
            assert (a.token_ids, a.finish_reason) == (b.token_ids, b.finish_reason), g.request_id
            assert (a.cumulative_logprob is None) == (b.cumulative_logprob is None)
            if a.cumulative_logprob is not None:
                assert a.cumulative_logprob == approx(b.cumulative_logprob)
            assert len(a.logprobs or []) == len(b.logprobs or [])
            for x, y in zip(a.logprobs or [], b.logprobs or [], strict=True):
                assert {t: e.logprob for t, e in x.items()} == approx({t: e.logprob for t, e in y.items()})
        assert len(g.prompt_logprobs or []) == len(w.prompt_logprobs or [])
        for x, y in zip(g.prompt_logprobs or [], w.prompt_logprobs or [], strict=True):
            assert (x is None) == (y is None)
            if x is not None:
                assert {t: e.logprob for t, e in x.items()} == approx({t: e.logprob for t, e in y.items()})


def mixed_requests(tiny_model_dir):
    """Stops by token, by EOS-like ids and by length; seeded sampling with top-k/top-p; n samples;
    logprobs and prompt logprobs; a grammar. The last four need the host each token, so their
    steps run synchronously inside an async engine."""
    prompts = random_prompts(12, seed=3)
    greedy = [SamplingParams(max_tokens=6 + i, temperature=0) for i in range(4)]
    reference = tiny(tiny_model_dir, False).generate(prompts[:4], greedy)
    stops = [o.token_ids[2] for o in reference]  # tokens the greedy outputs reach at step 3
    params = [SamplingParams(max_tokens=6 + i, temperature=0, stop_token_ids=[stops[i]]) for i in range(4)]
    params += [SamplingParams(max_tokens=9, temperature=0.8, top_k=40, top_p=0.9, seed=100 + i) for i in range(3)]
    params += [SamplingParams(max_tokens=5, temperature=0.7, n=3, seed=7),
               SamplingParams(max_tokens=5, temperature=0, logprobs=3),
               SamplingParams(max_tokens=3, temperature=0, prompt_logprobs=2),
               SamplingParams(max_tokens=8, temperature=0, structured_output=StructuredOutput(choice=["alpha", "beta"])),
               SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)]
    return prompts, params


@pytest.mark.parametrize("mode", [dict(), dict(max_num_batched_tokens=24), dict(num_kv_blocks=14, max_num_batched_tokens=64)],
                         ids=["default", "chunked", "preempting"])
def test_async_outputs_equal_sync_for_every_kind_of_request(tiny_model_dir, mode):
    prompts, params = mixed_requests(tiny_model_dir)
    sync = tiny(tiny_model_dir, False, **mode).generate(prompts, params)
    llm = tiny(tiny_model_dir, True, **mode)
    got = llm.generate(prompts, params)
    same_outputs(got, sync)
    assert [o.outputs[0].finish_reason for o in got[:4]] == ["stop"] * 4  # stop tokens hit, not lengths
    assert all(len(o.outputs[0].token_ids) == 3 for o in got[:4])
    stats = llm.stats()
    assert stats["kv_blocks_used_now"] == 0 and not llm.engine.has_unfinished()
    if "num_kv_blocks" in mode:
        assert stats["preemptions"] > 0


def test_step_t_plus_1_is_launched_before_step_t_is_read(tiny_model_dir):
    """The order of device work and host waits: with async scheduling every decode step is on the
    device before the host waits for the one before it."""
    llm = tiny(tiny_model_dir, True)
    eng, log = llm.engine, []
    launch = eng.runner.launch

    def logged_launch(batch, previous):
        step = launch(batch, previous)
        log.append(("launch", batch.step))
        wait = step.wait
        step.wait = lambda: (log.append(("wait", batch.step)), wait())[1]
        return step

    eng.runner.launch = logged_launch
    llm.generate(random_prompts(4, seed=1), SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    launches = [s for kind, s in log if kind == "launch"]
    assert len(launches) >= 6
    for step in launches[1:]:
        assert log.index(("launch", step)) < log.index(("wait", step - 1))


def test_abort_while_a_step_is_in_flight(tiny_model_dir):
    llm = tiny(tiny_model_dir, True)
    eng = llm.engine
    for i, p in enumerate(random_prompts(3, seed=2)):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    for _ in range(3):
        eng.step()
    assert eng._in_flight is not None
    eng.abort_request("r1")
    done = []
    while eng.has_unfinished():
        done += eng.step()
    assert sorted(o.request_id for o in done) == ["r0", "r2"]
    assert all(len(o.token_ids) == 12 for o in done)
    assert eng.stats()["kv_blocks_used_now"] == 0


def test_abort_all_drops_the_step_in_flight(tiny_model_dir):
    """What a worker does after a shard failed half-way: the engine is empty at once, with no
    launched step left for the next shard to wait on."""
    eng = tiny(tiny_model_dir, True).engine
    for i, p in enumerate(random_prompts(3, seed=2)):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    for _ in range(3):
        eng.step()
    assert eng._in_flight is not None
    assert sorted(eng.abort_all()) == ["r0", "r1", "r2"]
    assert eng._in_flight is None and not eng.has_unfinished()
    assert eng.stats()["kv_blocks_used_now"] == 0
    eng.add_request("r3", [5, 6, 7], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    done = []
    while eng.has_unfinished():
        done += eng.step()
    assert [(o.request_id, len(o.token_ids)) for o in done] == [("r3", 4)]


def test_a_block_holding_a_placeholder_is_published_once_its_token_is_known():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    seq = Sequence("a", [5, 6, 7], SamplingParams())
    assert bm.admit(seq, [], 3)
    seq.num_computed_tokens = 3
    seq.token_ids.append(PLACEHOLDER)  # the token at position 3 is still being sampled
    seq.num_pending_tokens = 1
    assert bm.allocate_slots(seq, 1)
    assert bm.block_hashes[seq.block_table[0]] is None  # its last token is unknown: not shareable yet
    seq.num_computed_tokens = 4
    seq.token_ids[-1], seq.num_pending_tokens = 8, 0
    seq.token_ids.append(9)
    assert bm.allocate_slots(seq, 1)
    other = Sequence("b", [5, 6, 7, 8, 1, 2], SamplingParams())
    assert bm.find_cached_prefix(other) == [seq.block_table[0]]
