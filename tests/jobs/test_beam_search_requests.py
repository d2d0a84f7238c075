"""Beam search reaches the engine from a spec's [sampling] and from OpenAI batch lines (vLLM's keys)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from engine import SamplingParams
from jobs import JobSpec
from jobs.openai_requests import parse_request
from jobs.spec_errors import format_errors


def spec_data(**sampling) -> dict:
    return {"name": "t", "input": {"url": "/data/in/"}, "output": {"url": "/data/out/"}, "sampling": sampling}


def test_sampling_beam_width_reaches_the_plan():
    plan = JobSpec.from_dict(spec_data(beam_width=4, length_penalty=0.6, early_stopping="never")).to_plan("b")
    params = SamplingParams(**plan.sampling)
    assert (params.beam_width, params.n, params.length_penalty, params.early_stopping) == (4, 1, 0.6, "never")
    assert "beam_width" not in JobSpec.from_dict(spec_data()).to_plan("g").sampling  # old fingerprints kept


@pytest.mark.parametrize(("sampling", "message"), [
    ({"beam_width": 2, "n": 3}, "sampling: n must be at most beam_width (2) with beam search, got 3"),
    ({"beam_width": 2, "stop": ["."]}, "sampling: beam search does not take stop"),
    ({"beam_width": 0}, "sampling.beam_width: Input should be greater than or equal to 1"),
])
def test_bad_beam_settings_fail_the_spec_at_load_time(sampling, message):
    with pytest.raises(ValidationError) as info:
        JobSpec.from_dict(spec_data(**sampling))
    assert format_errors(info.value, JobSpec) == [message]


def line(**body) -> str:
    return json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"messages": [{"role": "user", "content": "hi"}], **body}})


def test_openai_lines_take_vllms_beam_search_keys():
    _, row, sampling, ignored = parse_request(line(use_beam_search=True, n=2, length_penalty=0.5))
    assert sampling == {"n": 2, "beam_width": 2, "length_penalty": 0.5} and row["sampling"] == sampling
    _, _, sampling, ignored = parse_request(line(use_beam_search=True, best_of=4, early_stopping=True))
    assert sampling == {"beam_width": 4, "early_stopping": True} and not ignored
    with pytest.raises(ValueError) as err:
        parse_request(line(best_of=4))
    assert str(err.value) == "body.best_of needs body.use_beam_search = true"
    with pytest.raises(ValueError) as err:
        parse_request(line(use_beam_search=True, best_of=2, n=3))
    assert str(err.value) == "body: n must be at most beam_width (2) with beam search, got 3"
