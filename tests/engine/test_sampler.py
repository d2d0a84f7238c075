"""The sampler: whole-batch filters and one counter-based inverse-CDF draw per row, the same
code on the CPU and the GPU (run here on CPU tensors)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine.sampler import cut_offs, draw, draw_kept, filter_top_k_top_p, host_cut_offs, sample, uniform_draws
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence


def seq(seed: int, num_tokens: int = 5, **params) -> Sequence:
    s = Sequence("r", list(range(num_tokens)), SamplingParams(**({"temperature": 1.0} | params)))
    s.seed = None if s.params.greedy else seed
    return s


def test_greedy_rows_take_the_argmax_beside_sampled_rows():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    seqs = [seq(1, temperature=0.0), seq(2), seq(3, temperature=0.0), seq(4)]
    out = sample(logits, seqs)
    assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()
    assert out.dtype == torch.int64 and out.shape == (4,)


def test_bfloat16_logits_sample_what_their_float32_widening_samples():
    """The CUDA runner hands the sampler the LM head's bfloat16 logits: greedy rows take their
    argmax there (ties to the first index, as in float32) and drawing rows are widened first."""
    wide = torch.randn(6, 3000, generator=torch.Generator().manual_seed(2)).bfloat16().float()
    wide[0, 7] = wide[0, 1900] = wide[0].max() + 1.0  # a tie: the first index wins in both
    narrow = wide.bfloat16()
    greedy = [seq(0, temperature=0.0) for _ in range(6)]
    assert sample(narrow, greedy).tolist() == sample(wide, greedy).tolist()
    assert sample(narrow, greedy)[0] == 7
    mixed = [seq(1, temperature=0.0), seq(2), seq(3, top_k=40), seq(4, temperature=0.0), seq(5, top_p=0.8), seq(6)]
    assert sample(narrow, mixed).tolist() == sample(wide, mixed).tolist()


def test_a_row_draws_the_same_token_in_any_batch():
    """A draw is a function of (seed, position, distribution): it does not depend on the row's
    neighbours, its place in the batch, the batch size, or greedy rows beside it."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 300, generator=g)
    seqs = [seq(10 + i, num_tokens=7 + i, top_k=20, top_p=0.9) for i in range(6)]
    full = sample(logits, seqs).tolist()
    for i in range(6):
        assert sample(logits[i : i + 1], [seqs[i]]).tolist() == [full[i]]
    order = [5, 3, 1, 0, 2, 4]
    assert sample(logits[order], [seqs[i] for i in order]).tolist() == [full[i] for i in order]
    with_greedy = sample(torch.cat([logits[:1], logits]), [seq(0, temperature=0.0), *seqs]).tolist()
    assert with_greedy[1:] == full
    draws = {sample(torch.zeros(1, 300), [seq(10, num_tokens=n)]).item() for n in range(20)}
    assert len(draws) > 10  # the same seed at the next positions: other draws


def test_frequencies_follow_the_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    expected = torch.softmax(logits / 0.7, dim=0)
    rows = 4000
    seqs = [seq(1000 + i, temperature=0.7) for i in range(rows)]
    counts = torch.bincount(sample(logits.expand(rows, 4).clone(), seqs), minlength=4).double() / rows
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
    drawn = set(sample(logits[:1].expand(200, 5).clone(), seqs).tolist())
    assert drawn == {0, 1}


def test_the_batched_sampler_matches_a_row_at_a_time_reference():
    """Each row: temperature, top-k, top-p as HF applies them, then the first token whose running
    probability (float64, in Python) passes the row's uniform draw."""
    logits = torch.randn(5, 200, generator=torch.Generator().manual_seed(4))
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, top_k=30, top_p=0.8, seed=1),
              SamplingParams(temperature=1.3, seed=2), SamplingParams(temperature=0.5, top_p=0.5, seed=3),
              SamplingParams(temperature=0.0)]
    seqs = []
    for i, p in enumerate(params):
        s = Sequence("r", list(range(3 + i)), p)
        s.seed = None if p.greedy else 100 + i
        seqs.append(s)
    batched = sample(logits, seqs).tolist()
    for i, (p, s) in enumerate(zip(params, seqs, strict=True)):
        if p.greedy:
            assert batched[i] == int(logits[i].argmax())
            continue
        row = logits[i] / p.temperature
        if p.top_k:
            row = row.masked_fill(row < torch.topk(row, p.top_k).values[-1], float("-inf"))
        if p.top_p < 1:
            s_, order = torch.sort(row, descending=True)
            pr = torch.softmax(s_, -1)
            s_ = s_.masked_fill(pr.cumsum(-1) - pr > p.top_p, float("-inf"))
            row = torch.full_like(row, float("-inf")).scatter(0, order, s_)
        probs = torch.softmax(row, -1).tolist()
        u = float(uniform_draws(np.array([s.seed]), np.array([s.num_tokens]))[0]) * sum(probs)
        running, want = 0.0, None
        for token, prob in enumerate(probs):
            running += prob
            if running > u:
                want = token
                break
        assert batched[i] == want


def test_a_token_of_zero_probability_is_never_drawn():
    probs = torch.tensor([[0.0, 0.3, 0.7, 0.0], [0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    lowest, highest = 2.0**-24, 1.0 - 2.0**-24  # the extremes uniform_draws can return
    assert draw(probs, torch.full((3,), lowest)).tolist() == [1, 0, 2]
    assert draw(probs, torch.full((3,), highest)).tolist() == [2, 1, 2]
    assert draw(probs, torch.ones(3)).tolist() == [2, 1, 2]  # even a draw of exactly 1 stays inside


def test_uniform_draws_are_uniform_and_distinct():
    seeds = np.repeat(np.arange(256), 64)
    positions = np.tile(np.arange(64), 256)
    u = uniform_draws(seeds, positions)
    assert u.dtype == np.float32 and u.min() > 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.std() - math.sqrt(1 / 12)) < 0.01
    assert len(np.unique(u)) > 0.99 * len(u)
    big = uniform_draws(np.array([2**40 + 7, 7]), np.array([3, 3]))
    assert big[0] != big[1]  # the seed's high bits count
    assert uniform_draws(np.array([2**63 - 1]), np.array([0]))[0] == uniform_draws(np.array([2**63 - 1]), np.array([0]))[0]


def test_a_tiny_temperature_is_greedy_and_never_draws_past_the_vocabulary():
    """logits / 1e-45 overflows float32 (NaN probabilities); such a row decodes greedily, and a
    row whose distribution is NaN anyway takes its argmax instead of the index ``vocab``."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(7))
    seqs = [seq(1, temperature=1e-45), seq(2, temperature=1e-38), seq(3, temperature=1e-6)]
    assert all(s.params.greedy for s in seqs)
    assert sample(logits, seqs).tolist() == logits.argmax(-1).tolist()
    nan = torch.full((2, 4), float("nan"))
    assert all(0 <= t < 4 for t in draw(nan, torch.tensor([0.5, 0.99])).tolist())


def test_a_top_p_of_one_keeps_every_token_beside_rows_that_filter():
    """Rounding can carry a row's running sum past 1.0 before its last tokens: with top_p 1 the
    row still keeps them all, whatever its neighbours filter."""
    logits = torch.randn(2, 49152, generator=torch.Generator().manual_seed(3)) * 4
    kept = filter_top_k_top_p(logits, torch.tensor([0, 0]), torch.tensor([1.0, 0.5]))
    assert torch.isfinite(kept[0]).all()
    assert not torch.isfinite(kept[1]).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_the_gpu_draws_what_the_cpu_draws():
    logits = torch.randn(64, 4096, generator=torch.Generator().manual_seed(5))
    seqs = [seq(100 + i, num_tokens=3 + i, temperature=0.9, top_k=(0, 40)[i % 2], top_p=(1.0, 0.9)[i % 3 == 0])
            for i in range(63)] + [seq(0, temperature=0.0)]
    assert sample(logits.cuda(), seqs).cpu().tolist() == sample(logits, seqs).tolist()
    one = sample(logits[:1].cuda(), seqs[:1]).item()  # one row: another scan on the device
    assert one == sample(logits[:1], seqs[:1]).item()
    narrow = logits.bfloat16()  # the CUDA runner's greedy steps: argmax of the LM head's bfloat16
    assert sample(narrow.cuda(), seqs).cpu().tolist() == sample(narrow.float(), seqs).tolist()
    assert sample(narrow.cuda(), seqs[-1:] * 64).cpu().tolist() == narrow.float().argmax(-1).tolist()


def test_the_cpu_path_draws_what_the_vocabulary_wide_path_draws():
    """CPU rows that filter take numpy cut-offs and a draw over the kept tokens only; the GPU (and
    this reference) masks, normalises and sums the whole vocabulary. Same cut-offs, same tokens:
    rows with ties at the cut, top-k alone, top-p alone, neither, and a NaN row."""
    g = torch.Generator().manual_seed(11)
    rows, vocab = 300, 700
    logits = torch.randn(rows, vocab, generator=g) * 3
    logits[::7, 100:140] = logits[::7, 100:101]  # 40-way ties, inside the top-k for some rows
    logits = logits.round(decimals=1)  # more ties
    logits[5] = float("nan")
    top_k = torch.tensor([(0, 1, 5, 40, 60)[i % 5] for i in range(rows)])
    top_p = torch.tensor([(1.0, 0.9, 0.5, 0.99)[i % 4] for i in range(rows)], dtype=torch.float32)
    for k_max in (None, 60):
        k = top_k if k_max is None else torch.where(top_k > 0, top_k, torch.full_like(top_k, k_max))
        want_cut = cut_offs(logits, k, top_p, k_max)
        got_cut = host_cut_offs(logits.numpy(), k.numpy(), top_p.numpy(), k_max)
        assert torch.equal(torch.from_numpy(got_cut)[:5], want_cut[:5]) and torch.equal(
            torch.from_numpy(got_cut)[6:], want_cut[6:])
        assert np.isnan(got_cut[5])
        uniform = torch.from_numpy(uniform_draws(np.arange(rows), np.full(rows, 3)))
        probs = torch.softmax(logits.masked_fill(logits < want_cut[:, None], float("-inf")), dim=-1)
        want = draw(probs, uniform)
        got = draw_kept(logits.numpy(), got_cut, uniform.numpy())
        assert got.tolist() == want.tolist()
