"""The ``tokenmill`` model of lm-evaluation-harness: ``lm_eval --model tokenmill --model_args model=...``.

It follows the harness's ``hf`` model wherever a number depends on it, so both report the
same scores: the same tokenization (``TemplateLM`` splits context and continuation; the
tokenizer's own special tokens unless ``add_bos_token`` says otherwise), the same
left-truncation, ``is_greedy`` as every continuation token being the argmax, rolling windows
from the harness's ``get_rolling_token_windows`` / ``make_disjoint_window`` over
``max_length`` tokens, and generations cut at the ``until`` strings and EOS.

The request methods, and how they follow the harness's ``hf`` model, are ``harness.model_base``'s.
What differs is how requests run: each request type goes to the engine in one call
(``harness.engine_calls``). A log-likelihood request is context + continuation with
``prompt_logprobs_start`` at the context's end, so the engine scores only the continuation
and its prefix cache computes a context shared by several continuations once.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import model_registry, register_model

from engine.llm import LLM
from engine.model_registry import DEFAULT_MODEL
from engine.sampling_params import SamplingParams
from harness.engine_calls import RunStats, run_prompts
from harness.fleet_model import FleetLM
from harness.model_base import TokenmillBase, engine_settings

log = logging.getLogger("lm_eval.models.tokenmill")  # shown at the harness's verbosity
NAME = "tokenmill"


class TokenmillLM(TokenmillBase):
    """``TokenmillLM(model=NAME_OR_DIR, dtype="float32", ...)``; also usable directly with
    ``lm_eval.simple_evaluate(model=TokenmillLM(...))``."""

    def __init__(
        self,
        model: str | None = None,
        pretrained: str | None = None,  # the harness's usual name for the same thing
        dtype: str = "float32",
        device: str | None = None,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        add_bos_token: bool | None = None,
        prefix_token_id: int | None = None,
        seed: int = 1234,
        progress: bool = True,
        batch_size: Any = None,  # accepted for the CLI's sake; every request goes to the engine at once
        max_batch_size: Any = None,
        **engine_args: Any,
    ) -> None:
        super().__init__()
        settings = engine_settings(engine_args)
        if max_length is not None:
            # A scored input of max_length tokens is a prompt of max_length + 1 (the last token is
            # scored, not run) and the engine samples one token after it.
            settings["max_model_len"] = int(max_length) + 2
        self.llm = LLM(model or pretrained or DEFAULT_MODEL, dtype=dtype,
                       device=_device(device), seed=int(seed), **settings)
        self._take_settings(self.llm.tokenizer, self.llm.engine.max_model_len, max_length, max_gen_toks,
                            add_bos_token, prefix_token_id, seed, progress)
        self.runs: list[RunStats] = []  # one per harness call, for whoever wants the figures

    @classmethod
    def _runner_for(cls, arg_dict: dict[str, Any]) -> type[TemplateLM]:
        """``--model tokenmill`` with ``work_dir=`` (and ``broker=``) in its model_args runs every
        request type as a job (``harness.fleet_model``); without, on an engine in this process."""
        if cls is TokenmillLM and ("work_dir" in arg_dict or "broker" in arg_dict):
            return FleetLM
        return cls

    def stats(self) -> dict[str, Any]:
        return self.llm.stats()

    def _score(self, prompts: list[list[int]], starts: list[int], disable_tqdm: bool) -> list[tuple[float, bool]]:
        """(sum of the logprobs of ``prompt[start:]``, whether each of those tokens was the argmax)
        per prompt, on this process's engine."""
        params = [SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, prompt_logprobs_start=s)
                  for s in starts]
        outs, stats = run_prompts(self.llm, prompts, params, "loglikelihood", self.progress and not disable_tqdm)
        self.runs.append(stats)
        answers = []
        for prompt, start, out in zip(prompts, starts, outs, strict=True):
            entries = [out.prompt_logprobs[p][prompt[p]] for p in range(start, len(prompt))]
            answers.append((sum(e.logprob for e in entries), all(e.rank == 1 for e in entries)))
        return answers

    def _generate(self, prompts: list[list[int]], params: list[SamplingParams], disable_tqdm: bool) -> list[str]:
        """Each prompt's generated text (stop strings and EOS applied by the engine)."""
        outs, stats = run_prompts(self.llm, prompts, params, "generate_until", self.progress and not disable_tqdm)
        self.runs.append(stats)
        return [out.text for out in outs]


def _device(device: str | None) -> str:
    """The harness's CLI defaults to ``cuda:0``; on a machine without CUDA that means the CPU."""
    if not device or device == "auto":
        return "auto"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            log.warning("device %s requested but CUDA is not available; running on the CPU", device)
            return "cpu"
    return device


def register() -> None:
    """Register ``tokenmill`` with the harness unless it is there already (an entry-point
    placeholder from a harness that discovers plugins, or an earlier import)."""
    if NAME not in model_registry:
        register_model(NAME)(TokenmillLM)


register()
