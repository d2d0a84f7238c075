"""The ``tokens`` request mode through kind ``harness_requests``, embedded, on the tiny model: a
scored row gets the engine's own log-likelihood and greedy flag for its span, a generated row
the engine's text under its own sampling settings, and a row that cannot be a request becomes
an error row naming itself (rows in == rows out)."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline_support import tiny_engine

from connectors import read_parts
from engine import LLM, SamplingParams
from jobs.spec import JobSpec
from pipeline.job_runner import run_embedded

PROMPT = [1, 504, 3100, 314, 2016, 30, 378, 1565]


def _spec(tmp_path: Path, rows: list[dict], model_dir: Path) -> JobSpec:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings = {k: v for k, v in tiny_engine(model_dir).items() if k != "model"}
    return JobSpec.from_dict({
        "name": "tokens", "kind": "harness_requests",
        "input": {"url": str(tmp_path / "in"), "id_field": "id"}, "output": {"url": str(tmp_path / "out")},
        "model": {"path": str(model_dir), **settings},
    })


def test_scored_and_generated_rows_and_their_errors(tmp_path, tiny_model_dir) -> None:
    rows = [
        {"id": "scored", "text": "loglikelihood", "prompt": PROMPT, "score_from": 5},
        {"id": "generated", "text": "generate_until", "prompt": PROMPT,
         "sampling": {"max_tokens": 6, "temperature": 0.0, "ignore_eos": True}},
        {"id": "not-ids", "text": "loglikelihood", "prompt": "Paris", "score_from": 1},
        {"id": "past-end", "text": "loglikelihood", "prompt": PROMPT[:3], "score_from": 3},
        {"id": "bad-sampling", "text": "generate_until", "prompt": PROMPT, "sampling": {"top_p": 0}},
        {"id": "costly-sampling", "text": "generate_until", "prompt": PROMPT,
         "sampling": {"max_tokens": 4, "n": 128, "prompt_logprobs": 20}},
    ]
    spec = _spec(tmp_path, rows, tiny_model_dir)
    manifest = run_embedded(spec.to_plan("tokens-1"), progress=False)
    assert manifest["status"] == "succeeded" and manifest["totals"]["rows"] == len(rows)
    out = {r["id"]: r for r in read_parts(spec.output.url).to_pylist()}
    assert sorted(out) == sorted(r["id"] for r in rows)

    llm = LLM(str(tiny_model_dir), **{k: v for k, v in tiny_engine(tiny_model_dir).items() if k != "model"})
    (scored,) = llm.generate([PROMPT], SamplingParams(max_tokens=1, prompt_logprobs=0, prompt_logprobs_start=5),
                             use_tqdm=False)
    entries = [scored.prompt_logprobs[p][PROMPT[p]] for p in range(5, len(PROMPT))]
    assert abs(out["scored"]["logprob"] - sum(e.logprob for e in entries)) <= 1e-5
    assert out["scored"]["is_greedy"] == all(e.rank == 1 for e in entries)
    assert out["scored"]["output"] is None and out["scored"]["error"] is None
    (generated,) = llm.generate([PROMPT], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
                                use_tqdm=False)
    assert out["generated"]["output"] == generated.text and out["generated"]["output_tokens"] == 6
    assert out["generated"]["logprob"] is None

    assert out["not-ids"]["error"] == "row 2: field 'prompt' must be a non-empty list of token ids"
    assert out["past-end"]["error"] == ("row 3: field 'score_from' must be an integer from 1 to 2 "
                                        "(the prompt has 3 tokens)")
    assert out["bad-sampling"]["error"].startswith("row 4: invalid sampling parameters: ")
    assert out["costly-sampling"]["error"] == (
        "row 5: field 'sampling' may set only beam_width, early_stopping, ignore_eos, length_penalty, max_tokens, "
        "seed, stop, stop_token_ids, temperature, top_k, top_p (not n, prompt_logprobs)")
    assert manifest["totals"]["errors"] == 4


def test_a_spec_of_the_kind_sets_no_prompt(tmp_path, tiny_model_dir) -> None:
    import pytest

    data = _spec(tmp_path, [], tiny_model_dir).model_dump(exclude_unset=True)
    data["prompt"] = {"system": "Be brief."}
    with pytest.raises(ValueError, match="prompt.system: kind 'harness_requests' rows carry their prompts"):
        JobSpec.from_dict(data)
