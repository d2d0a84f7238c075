"""Incremental stop-string matching finds exactly what a full decode every step would find."""

from __future__ import annotations

import pytest

from engine.detokenizer import StopStringMatcher
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

TEXT = ("Café crème — naïve façade 🙂🚀 costs 12,5 €; 東京 and Zürich.\n\nNext: the END marker, "
        "then <|im_end|> more text after the end.")


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.mark.parametrize("stops", [["END"], ["🚀"], ["東京", "Zürich"], ["\n\n"], ["never there"], ["e"]])
def test_matches_full_decode_at_every_step(tokenizer, stops):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert any(t in tokenizer.all_special_ids for t in ids)  # skipped in the text, as in a full decode
    matcher = StopStringMatcher(tokenizer)
    seq = Sequence("r", [1, 2, 3], SamplingParams(max_tokens=len(ids)))
    for n, token in enumerate(ids, 1):
        seq.token_ids.append(token)
        full = tokenizer.decode(ids[:n], skip_special_tokens=True)
        want = min((i for i in (full.find(s) for s in stops) if i >= 0), default=None)
        got = matcher.find(seq, stops)
        assert got == want, (n, got, want)
        if got is not None:
            break
    matcher.forget(seq)
    assert matcher.states == {}
