"""Beam search equals HF transformers' (sequences and scores), on beams that share KV blocks."""

from __future__ import annotations

import pytest
import torch
from beam_cases import beam_params, check_beams, hf_beams
from engine_cases import chat_prompts, hf_greedy, random_prompts
from family_models import FAMILIES, build_family

from engine import LLM, SamplingParams
from engine.beam_requests import BeamRequests
from engine.beam_search import BeamGroup
from engine.sequence import Sequence

# each exercises one mechanism under the beams; check_engine() asserts it ran
CONFIGS = {
    "prefix-caching-on": dict(enable_prefix_caching=True),
    "prefix-caching-off": dict(enable_prefix_caching=False),
    "preemption": dict(num_kv_blocks=10, max_num_batched_tokens=64),
}


def check_engine(llm: LLM, name: str) -> None:
    stats = llm.stats()
    assert stats["forked_samples"] > 0
    if name == "preemption":
        assert stats["preemptions"] > 0
    if name == "prefix-caching-off":
        assert stats["prefix_cache_hit_tokens"] == 0


@pytest.fixture(scope="module")
def real_case(default_model_dir):
    from transformers import AutoTokenizer

    prompts = [chat_prompts(AutoTokenizer.from_pretrained(default_model_dir))[i] for i in (3, 13)]  # "hi", "Salt."
    return prompts, hf_beams(default_model_dir, prompts, 16, [2])


def test_default_model_beams_match_hf(default_model_dir, real_case):
    """k = 2, 4, 8 in one engine, beams sharing prefix blocks (preemption: the family models,
    where it costs less of the suite's time)."""
    prompts, refs = real_case
    assert any(r["token_ids"][-1] == 2 for ref in refs for r in ref)  # some beams end on EOS
    llm = LLM("smollm2-135m-instruct", num_kv_blocks=256)
    check_beams(llm, prompts, refs, 16, "prefix-caching-on")
    check_engine(llm, "prefix-caching-on")

# one mechanism per family (each runs all of them with greedy decoding elsewhere): keeps the suite short
FAMILY_CONFIGS = {"qwen3": "preemption", "gemma3": "prefix-caching-off", "phi3": "prefix-caching-on",
                  "mistral-window": "preemption", "qwen3-moe": "prefix-caching-off", "mixtral": "preemption"}


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_family_beams_match_hf(kind, tmp_path, default_model_dir):
    """Small random models of each family (sliding windows, longrope, MoE): the same beams as HF,
    with prefix sharing, without, or preempted in a pool too small for all beams."""
    model_dir = build_family(kind, tmp_path / kind, default_model_dir)
    prompts = [random_prompts(2, seed=6)[1][:44]]  # longer than the window (20)
    refs = hf_beams(model_dir, prompts, 8, [2])
    name = FAMILY_CONFIGS[kind]
    llm = LLM(str(model_dir), **(dict(num_kv_blocks=128) | CONFIGS[name]))
    check_beams(llm, prompts, refs, 8, f"{kind} {name}")
    check_engine(llm, name)

def _group(k: int, max_new_tokens: int = 10, early_stopping: bool | str = False) -> BeamGroup:
    beam = Sequence("r", [5, 6], SamplingParams(beam_width=k, max_tokens=max_new_tokens))
    return BeamGroup(k, 1.0, early_stopping, frozenset({2}), 2, max_new_tokens, [beam])


def test_only_an_eos_among_the_first_k_candidates_finishes_a_hypothesis():
    """HF's rule: of the K = 2k candidates, an EOS ranked past the first k is neither a
    hypothesis nor a beam."""
    group = _group(2)
    group.candidates[group.beams[0]] = (torch.tensor([-0.1, -0.5, -1.0, -3.0]), torch.tensor([2, 7, 8, 9]))
    going = group.choose()
    assert [(t, s) for _, t, s in going] == [(7, -0.5), (8, -1.0)]
    assert [(h.token_ids, h.score, h.finish_reason) for h in group.finished] == [([2], pytest.approx(-0.1), "stop")]
    assert not group.done  # one hypothesis of two: the beams go on
    a, b = (Sequence("r", [5, 6, t], group.beams[0].params) for t in (7, 8))
    a.cumulative_logprob, b.cumulative_logprob = -0.5, -1.0
    group.beams = [a, b]
    group.candidates[a] = (torch.tensor([-0.2, -0.3, -4.0, -5.0]), torch.tensor([3, 4, 2, 9]))
    group.candidates[b] = (torch.tensor([-0.1, -2.0, -3.0, -6.0]), torch.tensor([2, 4, 5, 6]))
    going = group.choose()  # candidates: a+3 -0.7, a+4 -0.8, b+2 -1.1 (third: not finished), b+4 -3.0
    assert [(beam is a, t) for beam, t, _ in going] == [(True, 3), (True, 4)]
    assert len(group.finished) == 1


def test_early_stopping_ends_the_search_once_k_hypotheses_are_in():
    group = _group(1, early_stopping=True)
    group.candidates[group.beams[0]] = (torch.tensor([-0.1, -0.5]), torch.tensor([2, 7]))
    assert [t for _, t, _ in group.choose()] == [7] and group.done


@pytest.mark.parametrize(("params", "message"), [
    (dict(beam_width=0), "beam_width must be None or an integer from 1 to 128, got 0"),
    (dict(beam_width=2, n=3), "n must be at most beam_width (2) with beam search, got 3"),
    (dict(beam_width=2, early_stopping="sometimes"), 'early_stopping must be true, false or "never", got \'sometimes\''),
    (dict(beam_width=2, stop=["."]), "beam search does not take stop"),
])
def test_bad_beam_parameters_name_themselves(params, message):
    with pytest.raises(ValueError) as err:
        SamplingParams(**params)
    assert str(err.value) == message


@pytest.mark.parametrize("k", [4, 8])
def test_beams_of_a_300_token_prompt_hold_its_blocks_once(tiny_model_dir, k):
    """k beams of a 300-token prompt (18 full blocks and 12 tokens) hold the 18 full blocks once
    plus one partial block each, at every step: 18 + k blocks, not k * 19."""
    llm = LLM(str(tiny_model_dir), num_kv_blocks=256, enable_prefix_caching=False)
    engine, bm = llm.engine, llm.engine.block_manager
    engine.add_request("r", random_prompts(1, seed=3, shared=0)[0][:1] * 300,
                       SamplingParams(beam_width=k, n=k, max_tokens=4, ignore_eos=True))
    used, out = [], []
    while engine.has_unfinished():
        out += engine.step()
        used.append(bm.num_used_blocks)
    assert used[:-1] == [18 + k] * 3 and used[-1] == 0
    assert llm.stats()["kv_blocks_peak_used"] == 18 + k
    assert [len(c.token_ids) for c in out[0].outputs] == [4] * k


def test_beams_batch_with_other_requests_under_async_scheduling(tiny_model_dir):
    """Beam requests and greedy ones in the same steps of an engine that overlaps steps: the
    beams are HF's, the greedy requests' tokens are HF's too (steps with beams run unoverlapped)."""
    prompts = [p[:30] for p in random_prompts(3, seed=8)[1:]]
    refs = hf_beams(tiny_model_dir, prompts, 8, [2])
    greedy = random_prompts(4, seed=9)[:2]
    llm = LLM(str(tiny_model_dir), num_kv_blocks=128, async_scheduling=True)
    params = beam_params(8)
    outs = llm.generate([p for p in prompts for _ in params] + greedy,
                        params * len(prompts) + [SamplingParams(max_tokens=16, temperature=0)] * len(greedy))  # overlapped once the beams end
    for out, ref in zip(outs, refs, strict=False):
        assert [c.token_ids for c in out.outputs] == [r["token_ids"] for r in ref]
    assert [o.token_ids for o in outs[len(refs):]] == hf_greedy(tiny_model_dir, greedy, 16)


def test_beams_waiting_for_a_preempted_sibling_give_up_their_blocks(tiny_model_dir, monkeypatch):
    """8 beams in a 12-block pool without prefix caching: a preempted beam cannot come back while
    its siblings, whose candidates are in, hold the pool. They are parked (KV freed, candidates
    kept) and the search ends with HF's beams; without that the engine steps on, running nothing."""
    parked = []
    park_idle = BeamRequests.park_idle
    monkeypatch.setattr(BeamRequests, "park_idle", lambda self: parked.append(park_idle(self)) or parked[-1])
    prompt = random_prompts(3, seed=6)[1][:40]
    refs = hf_beams(tiny_model_dir, [prompt], 16, [2], [(8, 1.0, False)])
    llm = LLM(str(tiny_model_dir), num_kv_blocks=12, max_num_batched_tokens=64, enable_prefix_caching=False)
    engine = llm.engine
    engine.add_request("r", prompt, SamplingParams(beam_width=8, n=8, max_tokens=16))
    outs = []
    for _ in range(200):  # about 45 steps
        if not engine.has_unfinished():
            break
        outs += engine.step()
    assert not engine.has_unfinished() and any(parked)
    assert [c.token_ids for c in outs[0].outputs] == [r["token_ids"] for r in refs[0]]
    assert llm.stats()["kv_blocks_used_now"] == 0
