"""A harness request's ``gen_kwargs`` as engine sampling settings.

The harness's own ``normalize_gen_kwargs`` decides greedy or sampled (``do_sample``, a zero
temperature) and which ``max_gen_toks`` alias wins; what is left maps onto SamplingParams.
A setting the engine has no equivalent for is refused by name rather than ignored, so a
task never reports numbers for a decoding it did not get. ``num_beams`` above 1 is the
engine's beam search (``SamplingParams.beam_width``), with HF's ``length_penalty`` and
``early_stopping``.
"""

from __future__ import annotations

from typing import Any

from lm_eval.models.utils import normalize_gen_kwargs

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "seed")
BEAM_KEYS = ("num_beams", "length_penalty", "early_stopping")  # HF generate()'s beam search, greedy only
# HF generate() settings whose value here changes nothing.
NEUTRAL = {"num_beams": 1, "repetition_penalty": 1.0, "skip_special_tokens": True, "use_cache": True}


def sampling_for(gen_kwargs: dict[str, Any], default_max_gen_toks: int, seed: int) -> tuple[dict[str, Any], list[str], int]:
    """(SamplingParams keyword arguments, the ``until`` strings, max_gen_toks)."""
    kwargs = dict(normalize_gen_kwargs(dict(gen_kwargs), default_max_gen_toks))
    until = list(kwargs.pop("until", []) or [])
    max_gen_toks = int(kwargs.pop("max_gen_toks"))
    do_sample = bool(kwargs.pop("do_sample", False))
    for key, value in NEUTRAL.items():
        if key in kwargs and kwargs[key] == value:
            kwargs.pop(key)
    unknown = sorted(set(kwargs) - set(SAMPLING_KEYS) - set(BEAM_KEYS))
    if unknown:
        raise ValueError(f"tokenmill model: generation setting(s) {unknown} are not supported "
                         f"(supported: until, max_gen_toks, do_sample, {', '.join(SAMPLING_KEYS + BEAM_KEYS)})")
    if "num_beams" in kwargs:
        return _beams(kwargs, do_sample), until, max_gen_toks
    params: dict[str, Any] = {"temperature": float(kwargs.get("temperature", 0.0)) if do_sample else 0.0}
    if params["temperature"] > 0:
        if "top_p" in kwargs:
            params["top_p"] = float(kwargs["top_p"])
        if "top_k" in kwargs:
            params["top_k"] = int(kwargs["top_k"])
        params["seed"] = int(kwargs.get("seed", seed))
    return params, until, max_gen_toks


def _beams(kwargs: dict[str, Any], do_sample: bool) -> dict[str, Any]:
    """Beam search as HF's ``generate(num_beams=k, do_sample=False)`` runs it; the row gets the best beam."""
    if do_sample:
        raise ValueError("tokenmill model: num_beams with do_sample (beam sampling) is not supported")
    params: dict[str, Any] = {"beam_width": int(kwargs["num_beams"])}
    if "length_penalty" in kwargs:
        params["length_penalty"] = float(kwargs["length_penalty"])
    if "early_stopping" in kwargs:
        params["early_stopping"] = kwargs["early_stopping"]
    return params
