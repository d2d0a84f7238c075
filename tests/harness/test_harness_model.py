"""The ``tokenmill`` model of lm-evaluation-harness reports what the harness's own ``hf`` model
reports: per-request log-likelihoods within 1e-4, the same is_greedy flags, the same greedy
generations and the same metrics, on a multiple-choice task with shared few-shot contexts, a
generation task and a rolling log-likelihood task (the default model, float32, offline)."""

from __future__ import annotations

import importlib.metadata
import math
import tomllib
from pathlib import Path

import pytest
from beam_cases import hf_beams
from harness_support import TASKS, evaluate, metrics, responses, write_tasks
from hf_reference_cache import cached_reference

pytest.importorskip("lm_eval")

from lm_eval.api.registry import Registry, get_model  # noqa: E402

from engine import SamplingParams  # noqa: E402
from harness.model import TokenmillLM  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MAX_LENGTH = 128  # the second document spans several rolling windows


def _plain(value):
    """JSON-able copy of harness results (tuples, numpy floats)."""
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if hasattr(value, "item"):
        return value.item()
    return value


def _summary(result) -> dict:
    return {t: {"responses": _plain(responses(result, t)), "metrics": _plain(metrics(result, t))} for t in TASKS}


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-4 + 1e-6 * abs(b)  # a rolling sum adds up float32 noise over its tokens


def assert_same_as_hf(ours: dict, reference: dict) -> None:
    for (ll, greedy), (ref_ll, ref_greedy) in zip(
        (pair for doc in ours["tm_mc"]["responses"] for pair in doc),
        (pair for doc in reference["tm_mc"]["responses"] for pair in doc), strict=True,
    ):
        assert abs(ll - ref_ll) <= 1e-4, (ll, ref_ll)
        assert greedy == ref_greedy
    assert ours["tm_gen"]["responses"] == reference["tm_gen"]["responses"]
    for (total,), (ref_total,) in zip(ours["tm_roll"]["responses"], reference["tm_roll"]["responses"], strict=True):
        assert _close(total, ref_total), (total, ref_total)
    for task in TASKS:
        mine, theirs = ours[task]["metrics"], reference[task]["metrics"]
        assert mine.keys() == theirs.keys()
        for key, value in theirs.items():
            if isinstance(value, float) and ("perplexity" in key or "bits_per_byte" in key):
                assert math.isclose(mine[key], value, rel_tol=1e-6), (task, key, mine[key], value)
            else:
                assert mine[key] == value, (task, key, mine[key], value)


@pytest.fixture(scope="module")
def include_path(tmp_path_factory) -> str:
    return write_tasks(tmp_path_factory.mktemp("harness-tasks"))


@pytest.fixture(scope="module")
def hf_reference(default_model_dir, include_path) -> dict:
    """The harness's ``hf`` model on the three tasks (kept on disk between runs: hf_reference_cache)."""
    request = {"harness": importlib.metadata.version("lm_eval"), "max_length": MAX_LENGTH,
               "tasks": {p.name: p.read_text().replace(include_path, "") for p in sorted(Path(include_path).iterdir())}}
    return cached_reference(default_model_dir, request, lambda: _summary(evaluate(
        "hf", include_path, {"pretrained": str(default_model_dir), "dtype": "float32", "max_length": MAX_LENGTH})))


@pytest.fixture(scope="module")
def tokenmill_lm(default_model_dir) -> TokenmillLM:
    return TokenmillLM(model=str(default_model_dir), dtype="float32", device="cpu", max_length=MAX_LENGTH,
                       progress=False)


@pytest.mark.slow
def test_tokenmill_model_reports_what_the_hf_model_reports(tokenmill_lm, include_path, hf_reference):
    result = evaluate(tokenmill_lm, include_path)
    assert_same_as_hf(_summary(result), hf_reference)
    ll = next(r for r in tokenmill_lm.runs if r.what == "loglikelihood")
    assert ll.requests == 16 and ll.engine["prefix_cache_hit_tokens"] > 0  # the 2-shot context, once per question
    assert "prefix cache hits" in ll.summary()


def test_registered_by_name_and_by_entry_point():
    assert get_model("tokenmill") is TokenmillLM
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["lm_eval.models"]
    registry = Registry("model")  # as a harness that discovers plugins registers one: a lazy placeholder
    registry.register("tokenmill", target=importlib.metadata.EntryPoint(
        "tokenmill", declared["tokenmill"], "lm_eval.models"))
    assert registry.get("tokenmill") is TokenmillLM


def test_lm_eval_command_runs_the_tokenmill_model(tiny_model_dir, include_path, tmp_path, capsys):
    """``tokenmill lm-eval`` takes lm_eval's own arguments, ``--model tokenmill`` among them."""
    from cli.app import main

    with pytest.raises(SystemExit) as done:
        main(["lm-eval", "--model", "tokenmill", "--model_args",
              f"model={tiny_model_dir},num_kv_blocks=256,max_num_seqs=8,num_threads=1,progress=False",
              "--tasks", "tm_gen", "--include_path", include_path, "--device", "cpu",
              "--output_path", str(tmp_path / "out")])
    assert done.value.code in (0, None)
    assert "|tm_gen|" in capsys.readouterr().out.replace(" ", "")
    assert list((tmp_path / "out").rglob("results_*.json"))


def test_chat_template_and_generation_settings_on_a_small_model(tiny_model_dir, include_path):
    """--apply_chat_template renders the chat as the hf model does and greedy generations agree;
    seeded sampling repeats; more `until` strings than the engine takes still cut the text;
    a setting the engine cannot honour is refused by name."""
    from lm_eval.api.instance import Instance

    lm = TokenmillLM(model=str(tiny_model_dir), max_num_seqs=8, num_kv_blocks=256, num_threads=1, progress=False)
    ours = evaluate(lm, include_path, tasks=("tm_gen",), apply_chat_template=True)
    theirs = evaluate("hf", include_path, {"pretrained": str(tiny_model_dir), "dtype": "float32"}, tasks=("tm_gen",),
                      apply_chat_template=True)
    assert responses(ours, "tm_gen") == responses(theirs, "tm_gen")
    assert ours["samples"]["tm_gen"][0]["arguments"][0][0].startswith("<|im_start|>")

    def ask(**kwargs):
        return Instance("generate_until", {}, ("Once upon a time", kwargs), 0)

    sampled = [ask(do_sample=True, temperature=1.0, max_gen_toks=12, until=["zzz"], seed=7)] * 2
    first, second = lm.generate_until(sampled)
    assert first == second
    greedy = lm.generate_until([ask(max_gen_toks=12, until=["zzz"])])[0]
    many = ["q1", "q2", "q3", "q4", greedy[4:6]]  # the fifth string is the one that occurs
    cut = lm.generate_until([ask(max_gen_toks=12, until=many)])[0]
    assert cut == greedy[: greedy.index(greedy[4:6])]
    beam = lm.generate_until([ask(num_beams=4, max_gen_toks=8, until=["zzz"])])[0]  # the best of 4 beams
    prompt = lm.tok_encode("Once upon a time")
    best = lm.llm.generate([prompt], SamplingParams(beam_width=4, max_tokens=8))[0]
    assert beam == best.text
    assert best.token_ids == hf_beams(tiny_model_dir, [prompt], 8, [2], [(4, 1.0, False)])[0][0]["token_ids"]
    with pytest.raises(ValueError, match="num_beams with do_sample"):
        lm.generate_until([ask(num_beams=4, do_sample=True, temperature=1.0)])
