"""The sampler's whole-batch filters, and the GPU's counter-based noise run here on CPU tensors."""

from __future__ import annotations

import math

import torch

from engine.sampler import exponential_noise, filter_top_k_top_p, make_generator, sample, sample_on_device
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence


def seq(seed: int, num_tokens: int = 5, **params) -> Sequence:
    s = Sequence("r", list(range(num_tokens)), SamplingParams(**({"temperature": 1.0} | params)))
    s.generator = make_generator(seed)
    return s


def test_greedy_rows_take_the_argmax_beside_sampled_rows():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    seqs = [seq(1, temperature=0.0), seq(2), seq(3, temperature=0.0), seq(4)]
    out = sample_on_device(logits, seqs)
    assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()


def test_a_row_draws_the_same_token_in_any_batch():
    """Noise is a function of (seed, position, token id): a row's draw does not depend on its
    neighbours, its place in the batch, or the batch size."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 300, generator=g)
    seqs = [seq(10 + i, num_tokens=7 + i, top_k=20, top_p=0.9) for i in range(6)]
    full = sample_on_device(logits, seqs).tolist()
    for i in range(6):
        assert sample_on_device(logits[i : i + 1], [seqs[i]]).tolist() == [full[i]]
    order = [5, 3, 1, 0, 2, 4]
    assert sample_on_device(logits[order], [seqs[i] for i in order]).tolist() == [full[i] for i in order]
    draws = {sample_on_device(torch.zeros(1, 300), [seq(10, num_tokens=n)]).item() for n in range(20)}
    assert len(draws) > 10  # the same seed at the next positions: other draws


def test_frequencies_follow_the_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    expected = torch.softmax(logits / 0.7, dim=0)
    rows = 4000
    seqs = [seq(1000 + i, temperature=0.7) for i in range(rows)]
    counts = torch.bincount(sample_on_device(logits.expand(rows, 4).clone(), seqs), minlength=4).double() / rows
    assert torch.allclose(counts, expected.double(), atol=3.5 * math.sqrt(0.25 / rows))


def test_top_k_and_top_p_keep_exactly_the_allowed_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]] * 4))
    kept = filter_top_k_top_p(logits, torch.tensor([2, 0, 0, 3]), torch.tensor([1.0, 0.8, 0.45, 0.75]))
    assert torch.isfinite(kept).tolist() == [
        [True, True, False, False, False],  # top-k 2
        [True, True, True, False, False],  # 0.5 + 0.2 < 0.8 <= 0.85
        [True, False, False, False, False],  # the first token alone reaches 0.45
        [True, True, False, False, False],  # top-k 3 renormalised: 0.59 + 0.24 reaches 0.75
    ]
    assert torch.equal(filter_top_k_top_p(logits, torch.tensor([2, 1, 3, 3]), torch.tensor([1.0, 1.0, 0.45, 0.75]), 3),
                       filter_top_k_top_p(logits, torch.tensor([2, 1, 3, 3]), torch.tensor([1.0, 1.0, 0.45, 0.75])))
    seqs = [seq(i, top_k=2) for i in range(200)]
    drawn = set(sample_on_device(logits[:1].expand(200, 5).clone(), seqs).tolist())
    assert drawn == {0, 1}


def test_the_cpu_sampler_draws_with_each_requests_generator():
    """The batched CPU path gives what one row at a time gives (the sampler before batching)."""
    logits = torch.randn(5, 200, generator=torch.Generator().manual_seed(4))
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, top_k=30, top_p=0.8, seed=1),
              SamplingParams(temperature=1.3, seed=2), SamplingParams(temperature=0.5, top_p=0.5, seed=3),
              SamplingParams(temperature=0.0)]
    batched = sample(logits, params, [make_generator(i) for i in range(5)]).tolist()
    for i, p in enumerate(params):
        g = make_generator(i)
        row = logits[i] / (p.temperature or 1.0)
        if p.top_k:
            row = row.masked_fill(row < torch.topk(row, p.top_k).values[-1], float("-inf"))
        if p.top_p < 1:
            s, order = torch.sort(row, descending=True)
            pr = torch.softmax(s, -1)
            s = s.masked_fill(pr.cumsum(-1) - pr > p.top_p, float("-inf"))
            row = torch.full_like(row, float("-inf")).scatter(0, order, s)
        probs = torch.softmax(row, -1)
        want = int(logits[i].argmax()) if p.greedy else int(torch.argmax(probs / torch.empty_like(probs).exponential_(1.0, generator=g)))
        assert batched[i] == want


def test_noise_is_exponential():
    e = exponential_noise(torch.arange(64), torch.full((64,), 9), 4096)
    assert e.min() > 0 and abs(e.mean().item() - 1.0) < 0.02 and abs(e.std().item() - 1.0) < 0.03
