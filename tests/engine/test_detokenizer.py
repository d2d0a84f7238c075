"""Incremental detokenisation and stop strings find exactly what a full decode every step would find."""

from __future__ import annotations

import pytest

from engine.detokenizer import IncrementalDetokenizer
from engine.output_processor import OutputProcessor
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

TEXT = ("Café crème — naïve façade 🙂🚀 costs 12,5 €; 東京 and Zürich.\n\nNext: the END marker, "
        "then <|im_end|> more text after the end.")


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.fixture(scope="module")
def ids(tokenizer) -> list[int]:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert any(t in tokenizer.all_special_ids for t in ids)  # skipped in the text, as in a full decode
    assert any(tokenizer.decode([t]).endswith("\ufffd") for t in ids)  # characters split over tokens
    return ids


@pytest.mark.parametrize("stops", [["END"], ["🚀"], ["東京", "Zürich"], ["\n\n"], ["never there"], ["e"]])
def test_matches_full_decode_at_every_step(tokenizer, ids, stops):
    detokenizer = IncrementalDetokenizer(tokenizer)
    seq = Sequence("r", [1, 2, 3], SamplingParams(max_tokens=len(ids)))
    for n, token in enumerate(ids, 1):
        seq.token_ids.append(token)
        full = tokenizer.decode(ids[:n], skip_special_tokens=True)
        want = min((i for i in (full.find(s) for s in stops) if i >= 0), default=None)
        got = detokenizer.find_stop(seq, stops)
        assert got == want, (n, got, want)
        if got is not None:
            break


def test_incremental_text_is_the_full_decode_and_skips_special_tokens(tokenizer, ids):
    detokenizer = IncrementalDetokenizer(tokenizer)
    decoded_lengths = []
    decode = detokenizer.decode
    detokenizer.decode = lambda ids: decoded_lengths.append(len(ids)) or decode(ids)
    seq = Sequence("r", [1, 2, 3], SamplingParams(max_tokens=len(ids)))
    held_back = 0
    for n, token in enumerate(ids, 1):
        seq.token_ids.append(token)
        assert detokenizer.find_stop(seq, ["never there"]) is None
        state = seq.incremental_text
        full = tokenizer.decode(ids[:n], skip_special_tokens=True)
        assert state.num_seen == n and state.ids == [t for t in ids[:n] if t not in tokenizer.all_special_ids]
        if full.endswith("\ufffd"):  # an incomplete character waits for the token that completes it
            held_back += 1
            assert full.startswith(state.text) and len(state.text) < len(full)
        else:
            assert state.text == full, n
    assert held_back > 0 and "<|im_end|>" not in state.text
    assert max(decoded_lengths) <= 8  # each step decodes a few tokens around the new one, never the output


def test_a_stop_string_spanning_tokens_matches_on_the_token_that_completes_it(tokenizer, ids):
    pieces = [tokenizer.decode([t]) for t in ids]
    k = next(i for i, p in enumerate(pieces) if p == " marker")  # " END" then " marker"
    stop = pieces[k - 1][-2:] + pieces[k][:3]  # "ND ma": ends inside the token " marker"
    processor = OutputProcessor(tokenizer)
    seq = Sequence("r", [1, 2, 3], SamplingParams(max_tokens=len(ids), stop=[stop]))
    found_at = None
    for n, token in enumerate(ids, 1):
        seq.token_ids.append(token)
        cut = processor.find_stop_string(seq)
        if cut is not None:
            found_at = n
            break
    assert found_at == k + 1
    assert cut == tokenizer.decode(ids[: k + 1], skip_special_tokens=True).find(stop)


def test_without_stop_strings_nothing_is_decoded(tokenizer, ids):
    processor = OutputProcessor(tokenizer)
    seq = Sequence("r", [1, 2, 3], SamplingParams(max_tokens=len(ids)))
    seq.token_ids.extend(ids)
    assert processor.find_stop_string(seq) is None and seq.incremental_text is None
    assert OutputProcessor(None).find_stop_string(Sequence("r", [1], SamplingParams(stop=["x"]))) is None
