"""``LLM.generate`` queues each request as the scheduler's admission reaches it
(``LLMEngine.add_requests``): every step admits and computes exactly what it did when all
requests were queued before the first step, so outputs, errors and preemptions are the same."""

from __future__ import annotations

import gc
import random
import weakref

import pytest

from engine import LLM, RequestError, SamplingParams

VOCAB = 49152  # the tiny model's


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, VOCAB) for _ in range(20)]
    out = []
    for i in range(n):
        body = [rng.randrange(3, VOCAB) for _ in range(rng.choice([1, 5, 16, 17, 33, 40]))]
        out.append(shared + body if i % 3 else body)
    return out


def _recorded(llm: LLM) -> list[list[tuple[str, int, int]]]:
    """Every step's (request, sample, tokens) as the scheduler hands it out."""
    steps: list[list[tuple[str, int, int]]] = []
    schedule = llm.engine.scheduler.schedule

    def recording():
        batch = schedule()
        steps.append([(s.request_id, s.sample_index, n) for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True)])
        return batch

    llm.engine.scheduler.schedule = recording
    return steps


def _all_queued_first(llm: LLM, prompts, params) -> list:
    """The generate loop before the source: every request added, then the steps."""
    engine, results = llm.engine, {}
    ids = [str(i) for i in range(len(prompts))]
    for rid, prompt, p in zip(ids, prompts, params, strict=True):
        try:
            engine.add_request(rid, prompt, p)
        except RequestError as e:
            results[rid] = str(e)
    while engine.has_unfinished():
        for out in engine.step():
            results[out.request_id] = out
    return [results[rid] for rid in ids]


def _summary(out) -> object:
    return out if isinstance(out, str) else (out.token_ids, out.finish_reason, out.error)


def _fed(llm: LLM, prompts, params) -> list:
    outs = llm.generate(prompts, params)
    return [o.error if o.finish_reason == "error" else o for o in outs]


CASES = {
    "chunked-prefix": dict(max_num_batched_tokens=24, max_num_seqs=4),
    "async": dict(max_num_batched_tokens=24, max_num_seqs=4, async_scheduling=True),
    "preemption": dict(num_kv_blocks=12, max_num_seqs=6, max_num_batched_tokens=64),
    "static": dict(scheduling="static", max_num_seqs=4),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_step_admits_what_queueing_all_first_admitted(tiny_model_dir, case) -> None:
    prompts = _prompts(18, seed=len(case))
    longer = 24 if case == "preemption" else 0  # outputs that outgrow the pool
    params: list = [SamplingParams(max_tokens=6 + i % 9 + longer, temperature=0, ignore_eos=True)
                    for i in range(18)]
    params[4] = SamplingParams(max_tokens=5, temperature=0.9, top_k=40, seed=7, n=2, ignore_eos=True)
    params[7] = SamplingParams(max_tokens=5, temperature=0.8, n=2, ignore_eos=True)  # seeds drawn by the engine
    params[9] = {"max_tokens": 4, "temperature": -1}  # refused: invalid parameters
    prompts[13] = [5, VOCAB + 1]  # refused: outside the vocabulary
    settings = dict(num_kv_blocks=64) | CASES[case]
    runs = {}
    for mode in ("queued first", "fed"):
        llm = LLM(str(tiny_model_dir), **settings)
        steps = _recorded(llm)
        outs = _all_queued_first(llm, prompts, params) if mode == "queued first" else _fed(llm, prompts, params)
        scheduler = llm.engine.scheduler
        runs[mode] = (steps, [_summary(o) for o in outs], scheduler.num_preemptions, scheduler.prefix_hit_tokens,
                      scheduler.step_count)
    before, after = runs["queued first"], runs["fed"]
    assert after[0] == before[0]  # the same steps, admissions and chunks
    assert after[1] == before[1]  # the same tokens, finish reasons and errors
    assert after[2:] == before[2:]
    assert "invalid sampling parameters" in after[1][9] and "outside the vocabulary" in after[1][13]
    if case == "preemption":
        assert after[2] > 0
    assert len({rid for step in after[0] for rid, _, _ in step}) == 16


def test_the_first_step_runs_before_every_request_is_queued(tiny_model_dir) -> None:
    llm = LLM(str(tiny_model_dir), num_kv_blocks=64, max_num_seqs=4, max_num_batched_tokens=64)
    queued_at_first_forward = []

    def first_forward(seqs) -> None:
        if not queued_at_first_forward:
            queued_at_first_forward.append(len(llm.engine.requests))

    llm.engine.fault_injector = first_forward
    outs = llm.generate(_prompts(40, seed=1), SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [3] * 40
    assert 1 <= queued_at_first_forward[0] <= 4  # the step's own admissions, not all 40


def test_a_prompt_that_breaks_the_feed_fails_the_call_and_leaves_nothing_behind(tiny_model_dir) -> None:
    llm = LLM(str(tiny_model_dir), num_kv_blocks=64, max_num_seqs=2)
    prompts: list = _prompts(8, seed=2)
    prompts[5] = None  # not a prompt at all: a TypeError, as when requests were queued first
    with pytest.raises(TypeError):
        llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert not llm.engine.requests and not llm.engine.has_unfinished()
    outs = llm.generate(_prompts(3, seed=3), SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [4, 4, 4]


def test_a_failed_async_call_leaves_no_step_for_the_next_one(tiny_model_dir, caplog) -> None:
    """The launched step of a call that failed is waited for and dropped with its requests: the
    next call neither waits on it nor meets the error it ended with (a lost device, here)."""
    llm = LLM(str(tiny_model_dir), num_kv_blocks=64, max_num_seqs=2, async_scheduling=True)
    engine, launch, state = llm.engine, llm.engine.runner.launch, {"device_lost": False}

    def launch_on_a_device_that_can_fail(batch, previous):
        step, lost = launch(batch, previous), state["device_lost"]  # lost while this step ran
        wait = step.wait

        def checked_wait():
            if lost:
                raise RuntimeError("device lost")
            return wait()

        step.wait = checked_wait
        return step

    class BreaksTheDevice(list):
        def __iter__(self):
            state["device_lost"] = True
            raise TypeError("not a prompt")

    engine.runner.launch = launch_on_a_device_that_can_fail
    prompts: list = _prompts(8, seed=2)
    prompts[5] = BreaksTheDevice()
    greedy = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    with pytest.raises(TypeError, match="not a prompt"):
        llm.generate(prompts, greedy)
    assert engine._in_flight is None and not engine.has_unfinished() and not engine.requests
    assert "dropped the step in flight" in caplog.text and "device lost" in caplog.text
    state["device_lost"] = False  # a device that came back
    fresh = LLM(str(tiny_model_dir), num_kv_blocks=64, max_num_seqs=2, async_scheduling=True)
    want = [o.token_ids for o in fresh.generate(_prompts(3, seed=3), greedy)]
    assert [o.token_ids for o in llm.generate(_prompts(3, seed=3), greedy)] == want


def test_an_ended_feed_keeps_none_of_the_callers_prompts(tiny_model_dir) -> None:
    """The engine keeps its last source (for ``source_failure``), not what that source was given."""

    class Prompt(list):  # a list that can be weakly referenced
        pass

    llm = LLM(str(tiny_model_dir), num_kv_blocks=64, max_num_seqs=2)
    prompts = [Prompt(p) for p in _prompts(5, seed=5)]
    alive = [weakref.ref(p) for p in prompts]
    outs = llm.generate(prompts, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [3] * 5
    del prompts
    gc.collect()
    assert [ref() for ref in alive] == [None] * 5


@pytest.mark.parametrize("max_num_seqs", [2, 4])
def test_the_feed_ends_with_its_last_request(tiny_model_dir, max_num_seqs) -> None:
    """Equal requests: the last admission fills the batch, and no empty step follows the call."""
    prompts, params = [[7, 8, 9, 10]] * 8, SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    counts = []
    for fed in (False, True):
        llm = LLM(str(tiny_model_dir), num_kv_blocks=64, max_num_seqs=max_num_seqs)
        steps = _recorded(llm)
        outs = _fed(llm, prompts, [params] * 8) if fed else _all_queued_first(llm, prompts, [params] * 8)
        assert [len(o.token_ids) for o in outs] == [5] * 8
        counts.append((len(steps), llm.engine.scheduler.step_count))
    assert counts[1] == counts[0]
    llm.generate([], params)
    assert llm.engine.scheduler.step_count == counts[1][1]  # nothing to add: no step


def test_a_failed_call_leaves_the_prefix_cache_sound(tiny_model_dir) -> None:
    """A request refused with a prompt that is not one breaks the call after others were admitted;
    a later call with the same prompt decodes what a fresh engine decodes."""
    prompt = _prompts(3, seed=4)[1]  # 20 shared + body tokens: full blocks to publish
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    llm = LLM(str(tiny_model_dir), num_kv_blocks=64, max_num_seqs=4)
    with pytest.raises(TypeError):
        llm.generate([prompt, None], [greedy, {"temperature": -1}])
    assert not llm.engine.requests
    fresh = LLM(str(tiny_model_dir), num_kv_blocks=64, max_num_seqs=4)
    assert llm.generate([prompt], greedy)[0].token_ids == fresh.generate([prompt], greedy)[0].token_ids


@pytest.mark.parametrize("seed", range(6))
def test_random_settings_and_requests_schedule_as_queued_first(tiny_model_dir, seed) -> None:
    """A differential over random engine settings and requests (lengths, budgets, a small pool,
    async, prefix caching on or off, n up to 3, seeded, unseeded, refused)."""
    rng = random.Random(seed)
    settings = dict(num_kv_blocks=rng.choice([10, 16, 64]), max_num_seqs=rng.choice([1, 2, 3, 5, 8]),
                    max_num_batched_tokens=rng.choice([16, 24, 40, 128]),
                    async_scheduling=rng.random() < 0.5, enable_prefix_caching=rng.random() < 0.7)
    n = rng.randrange(6, 20)
    prompts = _prompts(n, seed=100 + seed)
    params: list = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.5:
            params.append(SamplingParams(max_tokens=rng.randrange(1, 20), temperature=0, ignore_eos=True))
        elif kind < 0.8:
            params.append(SamplingParams(max_tokens=rng.randrange(1, 12), temperature=0.9, n=rng.randrange(1, 4),
                                         seed=rng.choice([None, 3]), ignore_eos=True))
        else:
            params.append({"max_tokens": 0})  # refused
    runs = []
    for fed in (False, True):
        llm = LLM(str(tiny_model_dir), **settings)
        steps = _recorded(llm)
        outs = _fed(llm, prompts, params) if fed else _all_queued_first(llm, prompts, params)
        scheduler = llm.engine.scheduler
        runs.append((steps, [_summary(o) for o in outs], scheduler.num_preemptions, scheduler.step_count))
    assert runs[1] == runs[0], settings
