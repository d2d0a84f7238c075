"""A harness request's ``gen_kwargs`` as engine sampling settings.

The harness's own ``normalize_gen_kwargs`` decides greedy or sampled (``do_sample``, a zero
temperature) and which ``max_gen_toks`` alias wins; what is left maps onto SamplingParams.
A setting the engine has no equivalent for is refused by name rather than ignored, so a
task never reports numbers for a decoding it did not get.
"""

from __future__ import annotations

from typing import Any

from lm_eval.models.utils import normalize_gen_kwargs

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "seed")
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
    unknown = sorted(set(kwargs) - set(SAMPLING_KEYS))
    if unknown:
        raise ValueError(f"tokenmill model: generation setting(s) {unknown} are not supported "
                         f"(supported: until, max_gen_toks, do_sample, {', '.join(SAMPLING_KEYS)})")
    params: dict[str, Any] = {"temperature": float(kwargs.get("temperature", 0.0)) if do_sample else 0.0}
    if params["temperature"] > 0:
        if "top_p" in kwargs:
            params["top_p"] = float(kwargs["top_p"])
        if "top_k" in kwargs:
            params["top_k"] = int(kwargs["top_k"])
        params["seed"] = int(kwargs.get("seed", seed))
    return params, until, max_gen_toks
