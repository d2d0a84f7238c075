"""Embeddings equal HF's pooled output: AutoModel's last hidden state (after the final norm),
pooled and normalised the same way, float32, one prompt at a time without padding."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from engine_cases import random_prompts
from family_models import FAMILIES, build_family
from model_fixtures import build_tiny_llama

from engine import LLM, PoolingParams, SamplingParams

TOL = 1e-4


def hf_pooled(model_dir, prompts, pooling: str, dimensions: int | None = None) -> list[np.ndarray]:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for p in prompts:
            hidden = model(torch.tensor([p])).last_hidden_state[0]
            vector = {"last": hidden[-1], "mean": hidden.mean(0), "cls": hidden[0]}[pooling]
            vector = vector[:dimensions] if dimensions else vector
            out.append(torch.nn.functional.normalize(vector, dim=0).numpy())
    return out


def assert_close(outs, refs) -> None:
    assert all(o.error is None and o.finish_reason == "stop" for o in outs), [o.error for o in outs]
    for out, ref in zip(outs, refs, strict=True):
        assert out.embedding.dtype == np.float32 and out.embedding.shape == ref.shape
        np.testing.assert_allclose(out.embedding, ref, atol=TOL, rtol=0)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("embed-llama"), None)


# The prompts are 1..120 tokens, most sharing a 20-token prefix; a 40-token step budget chunks
# the long ones, so mean pooling sums across chunks and last-token pooling reads the last chunk.
@pytest.mark.parametrize("kind", ["llama", *FAMILIES])
def test_last_token_embeddings_match_hf(kind, tmp_path):
    model_dir = build_tiny_llama(tmp_path / kind, None) if kind == "llama" else build_family(kind, tmp_path / kind, tmp_path)
    prompts = random_prompts(5, seed=3)
    llm = LLM(str(model_dir), num_kv_blocks=96, max_num_batched_tokens=40)
    assert_close(llm.embed(prompts, pooling="last"), hf_pooled(model_dir, prompts, "last"))


def test_mean_and_cls_pooling_and_matryoshka_match_hf(llama_dir):
    prompts = random_prompts(8, seed=5)
    llm = LLM(str(llama_dir), num_kv_blocks=96, max_num_batched_tokens=40)
    assert_close(llm.embed(prompts, pooling="mean"), hf_pooled(llama_dir, prompts, "mean"))
    # mean pooling takes nothing from the prefix cache: the shared prefix is computed again
    assert_close(llm.embed(prompts, pooling="mean"), hf_pooled(llama_dir, prompts, "mean"))
    assert_close(llm.embed(prompts, pooling="cls"), hf_pooled(llama_dir, prompts, "cls"))
    assert_close(llm.embed(prompts, dimensions=16), hf_pooled(llama_dir, prompts, "last", dimensions=16))
    raw = llm.embed(prompts[:2], normalize=False)
    assert [round(float(np.linalg.norm(o.embedding)), 3) for o in raw] != [1.0, 1.0]


def test_sentence_transformers_files_choose_the_pooling(tmp_path):
    model_dir = build_tiny_llama(tmp_path / "st", None)
    (model_dir / "1_Pooling").mkdir()
    (model_dir / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    (model_dir / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    prompts = random_prompts(3, seed=7)
    outs = LLM(str(model_dir), num_kv_blocks=64).embed(prompts)
    ref = hf_pooled(model_dir, prompts, "mean")  # (normalised here; no Normalize module: ours are not)
    for out, r in zip(outs, ref, strict=True):
        np.testing.assert_allclose(out.embedding / np.linalg.norm(out.embedding), r, atol=TOL, rtol=0)
        assert abs(float(np.linalg.norm(out.embedding)) - 1.0) > 1e-3


@pytest.mark.parametrize("overlapped", [False, True])
def test_embeddings_ride_with_generation_and_free_their_blocks(llama_dir, overlapped):
    """Embedding and generation requests share steps (synchronous and async scheduling); each
    embedding's blocks are free once the step that computed its prompt ends, and the generated
    tokens are those of generation alone."""
    prompts = random_prompts(6, seed=9)
    llm = LLM(str(llama_dir), num_kv_blocks=96, max_num_batched_tokens=64, enable_prefix_caching=False,
              async_scheduling=overlapped)
    alone = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0))]
    engine = llm.engine
    embed_seqs = {}
    for i, p in enumerate(prompts):
        engine.add_request(f"g{i}", p, SamplingParams(max_tokens=6, temperature=0))
        engine.add_request(f"e{i}", p, PoolingParams(pooling="last"))
        embed_seqs[f"e{i}"] = engine.requests[f"e{i}"].seqs[0]
    outs = {}
    while engine.has_unfinished():
        for out in engine.step():
            outs[out.request_id] = out
            if out.request_id.startswith("e"):
                assert embed_seqs[out.request_id].block_table == []  # its blocks went back in its step
    assert [outs[f"g{i}"].token_ids for i in range(6)] == alone
    assert_close([outs[f"e{i}"] for i in range(6)], hf_pooled(llama_dir, prompts, "last"))
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks


def test_bad_embedding_requests_are_errors_naming_them(llama_dir):
    llm = LLM(str(llama_dir), num_kv_blocks=32)
    outs = llm.embed([[5, 6, 7], [], [1] * 2000])
    assert outs[0].error is None
    assert outs[1].error == "request 1: empty prompt"
    assert outs[2].error == "request 2: prompt is 2000 tokens, the model's context is 1024 tokens"
    with pytest.raises(ValueError, match="^dimensions must be an integer >= 1, got 0$"):
        llm.embed([[5]], dimensions=0)
    with pytest.raises(Exception, match="dimensions must be at most the model's 64, got 65"):
        llm.engine.add_request("x", [5], PoolingParams(dimensions=65))
