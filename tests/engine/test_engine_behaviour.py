"""Sampling, stop conditions, continuous admission and bad input, on the tiny model."""

from __future__ import annotations

import pytest
from engine_cases import random_prompts

from engine import LLM, EngineConfig, LLMEngine, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(str(tiny_model_dir), num_kv_blocks=256, max_num_seqs=16)


def test_seeded_sampling_is_the_same_whatever_the_batch_mates(llm):
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, top_k=50, seed=1234)
    target = random_prompts(1, seed=7)[0]
    alone = llm.generate([target], params)[0].token_ids
    mates = random_prompts(9, seed=3)
    crowd = llm.generate(mates[:4] + [target] + mates[4:], [SamplingParams(max_tokens=9, temperature=1.0)] * 4
                         + [params] + [SamplingParams(max_tokens=5, temperature=0.5, seed=9)] * 5)
    assert crowd[4].token_ids == alone
    other_seed = llm.generate([target], SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, top_k=50, seed=99))
    assert other_seed[0].token_ids != alone


def test_top_k_one_is_greedy(llm):
    prompt = random_prompts(1, seed=11)[0]
    greedy = llm.generate([prompt], SamplingParams(max_tokens=10, temperature=0))[0].token_ids
    topk1 = llm.generate([prompt], SamplingParams(max_tokens=10, temperature=1.5, top_k=1, seed=5))[0].token_ids
    assert topk1 == greedy


def test_stop_strings_cut_the_text_before_the_stop(llm):
    prompt = random_prompts(1, seed=13)[0]
    full = llm.generate([prompt], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))[0]
    assert full.finish_reason == "length" and len(full.token_ids) == 16
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    assert stop.strip()
    cut = llm.generate([prompt], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, stop=[stop]))[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.find(stop)]
    assert stop not in cut.text


def test_stop_token_ids_end_the_request(llm):
    prompt = random_prompts(1, seed=17)[0]
    full = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
    stop_id = full.token_ids[3]
    out = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0, stop_token_ids=[stop_id]))[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == full.token_ids[: full.token_ids.index(stop_id) + 1]


def test_new_request_starts_the_step_after_one_finishes(tiny_model_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_model_dir), num_kv_blocks=256, max_num_seqs=4))
    prompts = random_prompts(12, seed=5)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, SamplingParams(max_tokens=[3, 9, 5, 14][i % 4], temperature=0, ignore_eos=True))
    outs = []
    while engine.has_unfinished():
        outs.extend(engine.step())
    assert len(outs) == 12
    finished_steps = sorted(o.metrics.finished_step for o in outs)
    starts = sorted(o.metrics.first_scheduled_step for o in outs)
    assert starts[:4] == [1, 1, 1, 1]
    # Every later admission happens exactly one step after a finish freed a slot.
    for start in starts[4:]:
        assert start - 1 in finished_steps
    assert engine.stats()["peak_running_seqs"] == 4


def test_bad_requests_get_errors_naming_them_and_the_rest_complete(llm):
    good = random_prompts(2, seed=21)
    outs = llm.generate(
        [good[0], [], list(range(5)) * 300, good[1], [10**9]],
        [SamplingParams(max_tokens=4, temperature=0)] * 4 + [SamplingParams(max_tokens=4)],
    )
    assert [o.finish_reason for o in outs] == ["length", "error", "error", "length", "error"]
    rid = [o.request_id for o in outs]
    assert outs[1].error == f"request {rid[1]}: empty prompt"
    assert outs[2].error == f"request {rid[2]}: prompt is 1500 tokens, the model's context is 1024 tokens"
    assert outs[4].error == f"request {rid[4]}: prompt has token ids outside the vocabulary [0, 49152)"
    assert len(outs[0].token_ids) == 4 and len(outs[3].token_ids) == 4


def test_invalid_sampling_values_fail_only_that_request(llm):
    outs = llm.generate([[5, 6, 7], [5, 6, 8]], [{"max_tokens": 3, "temperature": 0}, {"temperature": -1}])
    assert outs[0].error is None and len(outs[0].token_ids) == 3
    assert outs[1].error == (
        f"request {outs[1].request_id}: invalid sampling parameters: temperature must be a number >= 0, got -1"
    )
    with pytest.raises(ValueError, match="top_p must be in"):
        SamplingParams(top_p=0)


def test_request_that_can_never_fit_the_cache_is_an_error(tiny_model_dir):
    small = LLM(str(tiny_model_dir), num_kv_blocks=4)  # 64 token slots
    outs = small.generate([[5] * 40, [5] * 10], SamplingParams(max_tokens=40, temperature=0))
    assert outs[0].error == (
        f"request {outs[0].request_id}: needs 5 KV blocks (80 tokens) but the cache has 4 blocks in all; it can never run"
    )
    assert outs[1].error is None and len(outs[1].token_ids) == 40


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown model 'no-such-model': not a packaged model"):
        LLM("no-such-model")


def test_streaming_api_accepts_requests_while_others_run(tiny_model_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_model_dir), num_kv_blocks=128))
    engine.add_request("a", [5, 6, 7], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    engine.step()
    engine.add_request("b", [8, 9], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    done = []
    while engine.has_unfinished():
        done += [o.request_id for o in engine.step()]
    assert done == ["b", "a"]
    assert engine.stats()["kv_blocks_used_now"] == 0


def test_a_request_that_breaks_the_model_step_fails_alone(tiny_model_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_model_dir), num_kv_blocks=128))
    poison = 4242

    def injector(seqs):
        if any(poison in s.token_ids for s in seqs):
            raise RuntimeError("injected fault")

    engine.fault_injector = injector
    prompts = {"a": [5, 6, 7], "bad": [8, poison, 9], "c": [10] * 20}
    for rid, p in prompts.items():
        engine.add_request(rid, p, SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    outs = {}
    while engine.has_unfinished():
        outs.update({o.request_id: o for o in engine.step()})
    assert outs["bad"].finish_reason == "error"
    assert outs["bad"].error == "request bad: engine step failed: RuntimeError: injected fault"
    assert [len(outs[r].token_ids) for r in ("a", "c")] == [5, 5]
    reference = LLMEngine(EngineConfig(model=str(tiny_model_dir), num_kv_blocks=128))
    reference.add_request("a", prompts["a"], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    while reference.has_unfinished():
        for o in reference.step():
            assert o.token_ids == outs["a"].token_ids
    # The engine keeps serving after the fault.
    engine.add_request("after", [5, 6, 7], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    while engine.has_unfinished():
        done = engine.step()
    assert done[0].request_id == "after" and len(done[0].token_ids) == 2
    assert engine.stats()["kv_blocks_used_now"] == 0


def test_a_fault_in_a_request_whose_prefix_others_shared_this_step_recomputes_them(tiny_model_dir):
    """Requests admitted in the same step share the first one's prefix blocks before they
    are computed; if that first one fails, the others must not read its unwritten keys."""
    shared = list(range(100, 132))  # two full blocks
    poison = 4242
    prompts = {"owner": shared + [poison, 7], "s1": shared + [8, 9], "s2": shared + [10]}

    def run(inject: bool):
        engine = LLMEngine(EngineConfig(model=str(tiny_model_dir), num_kv_blocks=128))
        if inject:
            def injector(seqs):
                if any(poison in s.token_ids for s in seqs):
                    raise RuntimeError("injected fault")
            engine.fault_injector = injector
        for rid, p in prompts.items():
            if inject or rid != "owner":
                engine.add_request(rid, p, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
        outs = {}
        while engine.has_unfinished():
            outs.update({o.request_id: o for o in engine.step()})
        return outs, engine

    faulty, engine = run(True)
    clean, _ = run(False)
    assert faulty["owner"].finish_reason == "error"
    assert faulty["s1"].token_ids == clean["s1"].token_ids
    assert faulty["s2"].token_ids == clean["s2"].token_ids
    assert engine.stats()["kv_blocks_used_now"] == 0
