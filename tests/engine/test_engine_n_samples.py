"""n samples per prompt: one prompt computation, shared KV blocks, reproducible seeded streams."""

from __future__ import annotations

from engine_cases import random_prompts

from engine import LLM, SamplingParams
from engine.block_manager import BlockManager
from engine.sequence import Sequence

PROMPT = random_prompts(1, seed=5, shared=0)[0][:1] + list(range(100, 139))  # 40 tokens: 2 full blocks + 8


def tiny(tiny_model_dir, **kw) -> LLM:
    return LLM(str(tiny_model_dir), **(dict(num_kv_blocks=128, max_num_seqs=16) | kw))


def _computed_parent_and_child(bm: BlockManager) -> tuple[Sequence, Sequence]:
    """A 10-token parent whose prompt is computed, and its second sample, not yet forked."""
    parent = Sequence("r", list(range(10)), SamplingParams())
    assert bm.admit(parent, [], 10)
    parent.num_computed_tokens = 10
    return parent, Sequence("r", list(range(10)), SamplingParams(), sample_index=1)


def test_fork_shares_full_blocks_and_copies_the_partial_one():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    parent, child = _computed_parent_and_child(bm)
    pair = bm.fork(parent, child)
    assert child.block_table[:2] == parent.block_table[:2]
    assert pair == (parent.block_table[2], child.block_table[2])
    assert [bm.ref_counts[b] for b in parent.block_table] == [2, 2, 1]
    assert child.num_computed_tokens == 10 and bm.num_free_blocks == 4
    bm.free(child)
    assert [bm.ref_counts[b] for b in parent.block_table] == [1, 1, 1] and bm.num_free_blocks == 5


def test_fork_without_a_free_block_recomputes_the_partial_tokens():
    bm = BlockManager(num_blocks=3, block_size=4, enable_prefix_caching=False)
    parent, child = _computed_parent_and_child(bm)
    assert bm.fork(parent, child) is None
    assert child.block_table == parent.block_table[:2] and child.num_computed_tokens == 8


def test_n_samples_compute_the_prompt_once_and_share_its_blocks(tiny_model_dir):
    llm = tiny(tiny_model_dir, enable_prefix_caching=False)
    out = llm.generate([PROMPT], SamplingParams(n=4, max_tokens=5, temperature=1.0, seed=11, ignore_eos=True))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert all(len(c.token_ids) == 5 and c.finish_reason == "length" for c in out.outputs)
    assert out.token_ids == out.outputs[0].token_ids and out.text == out.outputs[0].text
    stats = llm.stats()
    assert stats["prompt_tokens_computed"] == len(PROMPT)
    assert stats["forked_samples"] == 3
    assert stats["fork_shared_blocks"] == 3 * 2 and stats["fork_copied_blocks"] == 3
    # 3 blocks of the prompt + one copied partial block per forked sample; no more.
    assert stats["kv_blocks_peak_used"] == 3 + 3
    assert stats["kv_blocks_used_now"] == 0


def test_greedy_samples_continue_from_the_copied_block(tiny_model_dir):
    """A wrong block copy would make the forked samples diverge from sample 0."""
    llm = tiny(tiny_model_dir)
    single = llm.generate([PROMPT], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    many = tiny(tiny_model_dir).generate([PROMPT], SamplingParams(n=3, max_tokens=12, temperature=0, ignore_eos=True))[0]
    assert [c.token_ids for c in many.outputs] == [single.token_ids] * 3


def test_seeded_samples_reproduce_whatever_the_batch(tiny_model_dir):
    params = SamplingParams(n=4, max_tokens=10, temperature=1.0, seed=7, ignore_eos=True)
    alone = tiny(tiny_model_dir).generate([PROMPT], params)[0]
    again = tiny(tiny_model_dir).generate([PROMPT], params)[0]
    others = random_prompts(6, seed=9)
    mixed = tiny(tiny_model_dir).generate(
        others[:3] + [PROMPT] + others[3:],
        [SamplingParams(n=2, max_tokens=6, temperature=0.9, seed=1)] * 3 + [params]
        + [SamplingParams(max_tokens=8, temperature=0)] * 3,
    )[3]
    streams = [c.token_ids for c in alone.outputs]
    assert len(set(map(tuple, streams))) > 1  # the samples differ from each other
    assert [c.token_ids for c in again.outputs] == streams
    assert [c.token_ids for c in mixed.outputs] == streams
    # Sample i draws from the stream seeded seed + i, as a one-sample request with that seed does.
    singles = tiny(tiny_model_dir).generate(
        [PROMPT] * 4, [SamplingParams(max_tokens=10, temperature=1.0, seed=7 + i, ignore_eos=True) for i in range(4)]
    )
    assert [o.token_ids for o in singles] == streams


def test_samples_survive_preemption(tiny_model_dir):
    params = SamplingParams(n=4, max_tokens=16, temperature=0.8, seed=2, ignore_eos=True)
    ample = tiny(tiny_model_dir).generate([PROMPT], params)
    tight_llm = tiny(tiny_model_dir, num_kv_blocks=7)  # the 4 samples need 10 blocks at the end
    tight = tight_llm.generate([PROMPT], params)
    assert tight_llm.stats()["preemptions"] > 0
    for a, t in zip(ample, tight, strict=True):
        assert [c.token_ids for c in t.outputs] == [c.token_ids for c in a.outputs]
    assert tight_llm.stats()["kv_blocks_used_now"] == 0


def test_any_integer_seed_names_a_stream_without_failing_its_batch(tiny_model_dir):
    """Seeds below 0 or past 64 bits (and seed + index past them) are taken modulo 2**64: the
    request runs, beside others, and -1 draws what 2**64 - 1 draws."""
    llm = tiny(tiny_model_dir)
    params = [SamplingParams(max_tokens=6, temperature=1.0, seed=s, n=2, ignore_eos=True)
              for s in (-1, 2**64 - 1, 2**70, 7)]
    outs = llm.generate([PROMPT] * 4, params)
    tokens = [[c.token_ids for c in o.outputs] for o in outs]
    assert all(o.error is None for o in outs) and all(len(t) == 6 for ts in tokens for t in ts)
    assert tokens[0] == tokens[1]  # -1 and 2**64 - 1: the same stream
    assert tokens[3][0] != tokens[3][1] and tokens[2][0] != tokens[0][0]  # other seeds, other streams
