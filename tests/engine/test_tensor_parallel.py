"""Two tensor-parallel ranks on the CPU (gloo, two processes) give the same greedy tokens as
one process, for every family; a rank's death is one clear error."""

from __future__ import annotations

import os
import re
import signal

import pytest
import torch
from engine_cases import random_prompts
from family_models import FAMILIES, SMALL, build_family
from model_fixtures import build_tiny_llama

from engine import LLM, SamplingParams, StructuredOutput
from engine.parallel.pool import RankPool, TensorParallelError

SETTINGS = dict(num_kv_blocks=64, max_num_batched_tokens=48)
GREEDY = SamplingParams(max_tokens=8, temperature=0)


@pytest.fixture(scope="module", autouse=True)
def one_pair_of_ranks():
    """The families share one spawned worker rank (each engine leaves it to the next)."""
    yield
    RankPool.stop_kept()


def _tokens(llm: LLM, prompts, params=GREEDY) -> list[list[list[int]]]:
    """Every sample's tokens, per prompt."""
    return [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params)]


def _both(model_dir, prompts, params=GREEDY):
    one = _tokens(LLM(str(model_dir), **SETTINGS), prompts, params)
    llm = LLM(str(model_dir), tensor_parallel_size=2, **SETTINGS)
    try:
        two = _tokens(llm, prompts, params)
    finally:
        llm.engine.close(keep_ranks=True)
    return one, two


def _build(kind, out, tokenizer_from):
    if kind == "llama":
        # an odd vocabulary: the second rank's rows end in a padding row (tied: in both tables)
        return build_tiny_llama(out, tokenizer_from, tie_word_embeddings=True, vocab_size=49153)
    if kind == "qwen2":  # q/k/v biases, split with their heads
        import transformers

        torch.manual_seed(1)
        cfg = transformers.Qwen2Config(**SMALL, use_sliding_window=False)
        model = transformers.Qwen2ForCausalLM(cfg)
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
        model.save_pretrained(out)
        return out
    return build_family(kind, out, tokenizer_from)


# gemma3: one KV head, copied to both ranks; phi3: checkpoint-fused q/k/v and gate/up; the MoE
# families split their experts (4 and 8) between the ranks; llama: a tied embedding and LM head of
# an odd vocabulary.
@pytest.mark.parametrize("kind", ["llama", "qwen2", *FAMILIES])
def test_two_ranks_match_one(kind, tmp_path, default_model_dir):
    model_dir = _build(kind, tmp_path / kind, default_model_dir)
    prompts = random_prompts(4, seed=3)
    one, two = _both(model_dir, prompts)
    assert two == one
    assert all(len(t) == GREEDY.max_tokens for [t] in one)


def test_forked_samples_copy_blocks_on_every_rank(tmp_path, default_model_dir):
    """``n`` samples fork after the prompt: the partial block's copy must happen on both ranks'
    pools, or the second rank's samples attend to a block never written."""
    model_dir = build_tiny_llama(tmp_path / "m", default_model_dir)
    params = SamplingParams(max_tokens=6, temperature=0, n=3)  # greedy: the tokens follow the KV closely
    prompts = [[(97 * i + 31 * t) % 40000 + 5 for t in range(13)] for i in (1, 2)]  # all in the partial block
    one, two = _both(model_dir, prompts, params)
    assert two == one


def test_gathered_logits_are_the_vocabulary_wide(tmp_path, default_model_dir):
    """An odd vocabulary pads the last rank's LM head rows; the gathered logits must drop the
    padding, or a grammar's token mask (one bit per vocabulary id) no longer lines up."""
    model_dir = build_tiny_llama(tmp_path / "m", default_model_dir, tie_word_embeddings=True, vocab_size=49153)
    params = SamplingParams(max_tokens=12, temperature=0, structured_output=StructuredOutput(regex="[a-z]{3,8} [0-9]{2}"))
    llm = LLM(str(model_dir), tensor_parallel_size=2, **SETTINGS)
    try:
        two = [o.outputs[0].text for o in llm.generate(["hello", "a b c"], params)]
    finally:
        llm.engine.close(keep_ranks=True)
    assert two == [o.outputs[0].text for o in LLM(str(model_dir), **SETTINGS).generate(["hello", "a b c"], params)]
    assert all(re.fullmatch("[a-z]{3,8} [0-9]{2}", text) for text in two)


def test_closing_the_engine_ends_its_ranks(tmp_path, default_model_dir):
    llm = LLM(str(build_tiny_llama(tmp_path / "m", default_model_dir)), tensor_parallel_size=2, **SETTINGS)
    workers = list(llm.engine.parallel.pool.processes)
    llm.close()
    assert [w.exitcode for w in workers] == [0]
    assert RankPool._kept is None


def test_a_dead_rank_is_one_clear_error(tmp_path, default_model_dir):
    model_dir = build_tiny_llama(tmp_path / "m", default_model_dir)
    llm = LLM(str(model_dir), tensor_parallel_size=2, **SETTINGS)
    try:
        worker = llm.engine.parallel.pool.processes[0]
        os.kill(worker.pid, signal.SIGKILL)
        worker.join()
        with pytest.raises(TensorParallelError, match=r"^tensor-parallel rank 1 exited with code -9$"):
            llm.generate(random_prompts(2, seed=1), GREEDY)
        with pytest.raises(TensorParallelError, match="rank 1 exited"):  # the engine stays failed
            llm.generate(random_prompts(1, seed=2), GREEDY)
    finally:
        llm.close()


def test_shapes_that_do_not_split_are_refused_before_any_process_starts(tmp_path, default_model_dir):
    model_dir = build_tiny_llama(tmp_path / "m", default_model_dir, num_attention_heads=4, num_key_value_heads=2,
                                 intermediate_size=100)
    with pytest.raises(ValueError, match=r"^tensor_parallel_size 3 does not divide the model's 4 attention heads, "
                                         r"2 KV heads \(neither a multiple nor a divisor of the ranks\), "
                                         r"intermediate_size 100$"):
        LLM(str(model_dir), tensor_parallel_size=3, **SETTINGS)
