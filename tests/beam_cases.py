"""HF transformers' beam search as the reference for the engine's (tests/engine/test_engine_beam_search.py)."""

from __future__ import annotations

from pathlib import Path

import torch
from engine_cases import hf_model
from hf_reference_cache import cached_reference

from engine import LLM, SamplingParams

# (beam width, length_penalty, early_stopping): each of HF's stopping rules at least once
SETTINGS = [(2, 1.0, False), (4, 0.6, True), (8, 1.0, "never")]


def hf_beams(model_dir: Path, prompts: list[list[int]], max_new_tokens: int, eos: list[int],
             settings=SETTINGS) -> list[list[dict]]:
    """Per prompt and setting, HF's ``k`` returned sequences (output tokens up to the first EOS)
    and ``sequences_scores``, best first: ``generate(num_beams=k, do_sample=False,
    num_return_sequences=k)``, one prompt at a time, float32."""

    def compute() -> list[list[dict]]:
        model = hf_model(str(model_dir))
        out = []
        with torch.inference_mode():
            for p in prompts:
                for k, lp, es in settings:
                    gen = model.generate(
                        torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                        max_new_tokens=max_new_tokens, do_sample=False, num_beams=k, num_return_sequences=k,
                        length_penalty=lp, early_stopping=es, eos_token_id=eos, pad_token_id=eos[0],
                        output_scores=True, return_dict_in_generate=True,
                    )
                    beams = []
                    for row, score in zip(gen.sequences[:, len(p):].tolist(), gen.sequences_scores.tolist(), strict=True):
                        ends = [i for i, t in enumerate(row) if t in eos]
                        beams.append({"token_ids": row[: ends[0] + 1] if ends else row, "score": score})
                    out.append(beams)
        return out

    request = {"kind": "beam", "dtype": "float32", "max_new_tokens": max_new_tokens, "eos": eos,
               "settings": [list(s) for s in settings], "prompts": [list(p) for p in prompts]}
    return cached_reference(model_dir, request, compute)


def beam_params(max_tokens: int, settings=SETTINGS) -> list[SamplingParams]:
    return [SamplingParams(beam_width=k, n=k, length_penalty=lp, early_stopping=es, max_tokens=max_tokens)
            for k, lp, es in settings]


def check_beams(llm: LLM, prompts: list[list[int]], refs: list[list[dict]], max_tokens: int, name: str,
                settings=SETTINGS) -> None:
    """Every prompt under every setting in one ``generate``: the same sequences as HF, best first,
    and the same scores within float tolerance."""
    params = beam_params(max_tokens, settings)
    outs = llm.generate([p for p in prompts for _ in params], params * len(prompts))
    for i, (out, ref) in enumerate(zip(outs, refs, strict=True)):
        assert out.error is None, out.error
        where = f"{name}: prompt {i // len(params)}, beam_width {settings[i % len(params)][0]}"
        assert [c.token_ids for c in out.outputs] == [r["token_ids"] for r in ref], where
        for c, r in zip(out.outputs, ref, strict=True):
            assert abs(c.score - r["score"]) < 1e-4, where
            lp = settings[i % len(params)][1]
            assert abs(c.cumulative_logprob - c.score * len(c.token_ids) ** lp) < 1e-3, where
    assert llm.stats()["kv_blocks_used_now"] == 0
