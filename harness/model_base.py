"""What every ``tokenmill`` model of lm-evaluation-harness shares, wherever its requests run.

It follows the harness's ``hf`` model wherever a number depends on it, so both report the
same scores: the same tokenization (``TemplateLM`` splits context and continuation; the
tokenizer's own special tokens unless ``add_bos_token`` says otherwise), the same
left-truncation, ``is_greedy`` as every continuation token being the argmax, rolling windows
from the harness's ``get_rolling_token_windows`` / ``make_disjoint_window`` over
``max_length`` tokens, and generations cut at the ``until`` strings and EOS. A subclass says
where the requests run (``_score``, ``_generate``): this process's engine (``harness.model``)
or a job (``harness.fleet_model``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import (
    _add_special_kwargs,
    handle_stop_sequences,
    has_bos_prefix,
    postprocess_generated_text,
)
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window, simple_parse_args_string

from engine.sampling_params import MAX_STOP, MAX_STOP_LENGTH, SamplingParams
from harness.gen_kwargs import sampling_for

if TYPE_CHECKING:
    from lm_eval.api.instance import Instance

log = logging.getLogger("lm_eval.models.tokenmill")  # shown at the harness's verbosity
# Engine settings a user may pass in --model_args (the rest of EngineConfig is left at its defaults).
ENGINE_ARGS = ("block_size", "enable_prefix_caching", "max_num_seqs", "max_num_batched_tokens", "num_kv_blocks",
               "kv_cache_memory_gb", "gpu_memory_utilization", "attention_backend", "num_threads",
               "enforce_eager", "compile", "async_scheduling")


def _flag(value: Any) -> Any:
    """``--model_args`` values arrive as strings ('True', '64'); the harness converts most, not all."""
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


def engine_settings(engine_args: dict[str, Any]) -> dict[str, Any]:
    """The engine settings among the model_args (``ENGINE_ARGS``, flags converted); ValueError
    naming any other argument, for every tokenmill model alike."""
    unknown = sorted(set(engine_args) - set(ENGINE_ARGS))
    if unknown:
        raise ValueError(f"tokenmill model: unknown model_args {unknown}; engine settings accepted: "
                         f"{', '.join(ENGINE_ARGS)}")
    return {k: _flag(v) for k, v in engine_args.items()}


class TokenmillBase(TemplateLM):
    """The harness's request methods over ``_score`` and ``_generate``, which a subclass runs."""

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> TemplateLM:
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict | None = None) -> TemplateLM:
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        return cls._runner_for(arg_dict)(**arg_dict, **extra)

    @classmethod
    def _runner_for(cls, arg_dict: dict[str, Any]) -> type[TemplateLM]:
        """The class that runs a model built from ``arg_dict`` (the registered model picks)."""
        return cls

    def _take_settings(self, tokenizer: Any, max_model_len: int, max_length: int | None, max_gen_toks: int,
                       add_bos_token: Any, prefix_token_id: int | None, seed: int, progress: Any) -> None:
        """What the request methods read, wherever the requests then run."""
        self.tokenizer = tokenizer
        self._max_length = max_model_len - 2
        if max_length is not None and self._max_length < int(max_length):
            log.warning("max_length %s exceeds the model's positions; using %d", max_length, self._max_length)
        self._max_gen_toks = int(max_gen_toks)
        self.add_bos_token = _flag(add_bos_token)
        self.custom_prefix_token_id = None if prefix_token_id is None else int(prefix_token_id)
        self.seed = int(seed)
        self.progress = bool(_flag(progress))

    # ---- what the harness asks of a model ----------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        if self.custom_prefix_token_id is not None:
            return self.custom_prefix_token_id
        if self.tokenizer.bos_token_id is not None:
            return self.tokenizer.bos_token_id
        return self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def tokenizer_name(self) -> str:
        return str(self.tokenizer.name_or_path).replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """As the ``hf`` model: the tokenizer's special tokens by default, none if the text
        already starts with the prefix (BOS) token's text, e.g. a rendered chat."""
        special = _add_special_kwargs(add_special_tokens, self.add_bos_token)
        if add_special_tokens is None and has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
            special["add_special_tokens"] = False
        return self.tokenizer.encode(string, **special)

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt,
        )

    # ---- log-likelihood ---------------------------------------------------------------
    def _loglikelihood_tokens(
        self, requests: list[tuple[Any, list[int], list[int]]], disable_tqdm: bool = False, **kwargs: Any
    ) -> list[tuple[float, bool]]:
        limit = self.max_length + 1  # the hf model's window: max_length inputs, the last token scored
        prompts, starts = [], []
        for _, context, continuation in requests:
            whole = (context + continuation)[-limit:]
            prompts.append(whole)
            starts.append(max(1, len(whole) - len(continuation)))  # a continuation longer than the window: all of it
        answers = self._score(prompts, starts, disable_tqdm)
        for (key, _, _), answer in zip(requests, answers, strict=True):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
        return answers

    def _score(self, prompts: list[list[int]], starts: list[int], disable_tqdm: bool) -> list[tuple[float, bool]]:
        """(sum of the logprobs of ``prompt[start:]``, whether each of those tokens was the argmax)
        per prompt."""
        raise NotImplementedError

    def _generate(self, prompts: list[list[int]], params: list[SamplingParams], disable_tqdm: bool) -> list[str]:
        """Each prompt's generated text (stop strings and EOS applied by the engine)."""
        raise NotImplementedError

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        """Each document's windows (the harness's rules, as the ``hf`` model cuts them), all
        documents' windows in one engine call, summed per document."""
        windows, owner = [], []
        for i, (text,) in enumerate(req.args for req in requests):
            pairs = get_rolling_token_windows(token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                                              max_seq_len=self.max_length, context_len=1)
            for context, continuation in map(make_disjoint_window, pairs):
                windows.append((None, context, continuation))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (logprob, _) in zip(owner, self._loglikelihood_tokens(windows, disable_tqdm), strict=True):
            totals[i] += logprob
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # ---- generation -------------------------------------------------------------------
    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        eos = self.tokenizer.decode([self.eot_token_id])
        prompts, params, stops = [], [], []
        for i, (context, gen_kwargs) in enumerate(req.args for req in requests):
            kwargs, until, max_gen_toks = sampling_for(gen_kwargs, self.max_gen_toks, self.seed + i)
            until = handle_stop_sequences(until, eos=eos)
            if max_gen_toks >= self.max_length:
                raise ValueError(f"max_gen_toks {max_gen_toks} leaves no room for the prompt in max_length "
                                 f"{self.max_length}")
            prompts.append(self.tok_encode(context)[-(self.max_length - max_gen_toks):])
            # The engine takes a few stop strings; the rest are cut afterwards (the text is the same).
            engine_stops = [s for s in until if s and len(s) <= MAX_STOP_LENGTH][:MAX_STOP]
            if "beam_width" in kwargs:  # beam search takes no stop strings: the text is cut below
                engine_stops = []
            params.append(SamplingParams(max_tokens=max_gen_toks, stop=engine_stops, **kwargs))
            stops.append(until)
        texts = self._generate(prompts, params, disable_tqdm)
        results = []
        for req, raw, until in zip(requests, texts, stops, strict=True):
            text = postprocess_generated_text(raw, until, None)
            self.cache_hook.add_partial("generate_until", req.args, text)
            results.append(text)
        return results
