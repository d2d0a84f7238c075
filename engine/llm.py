"""The offline API: hand over all prompts, get all outputs back in input order."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

from tqdm.auto import tqdm

from engine.config import EngineConfig
from engine.host import objects_frozen_during_call
from engine.llm_engine import LLMEngine, RequestError
from engine.model_registry import DEFAULT_MODEL
from engine.outputs import RequestOutput
from engine.pooling_params import PoolingParams
from engine.sampling_params import SamplingParams

Prompt = str | list[int]
Params = SamplingParams | dict[str, Any]


class LLM:
    """``LLM(model=..., **engine settings)``; see ``EngineConfig`` for the settings."""

    def __init__(self, model: str = DEFAULT_MODEL, **kwargs: Any) -> None:
        self.engine = LLMEngine(EngineConfig(model=model, **kwargs))
        self._next_id = 0

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Seq[Prompt],
        sampling_params: Params | Seq[Params] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Outputs in input order. A request that cannot run comes back with ``error`` set
        and ``finish_reason == "error"``; the others still complete. The objects alive before
        the call stay out of the cyclic collector's walks until it returns (``engine.host``)."""
        with objects_frozen_during_call():
            return self._generate(prompts, sampling_params, use_tqdm)

    def _generate(self, prompts: Seq[Prompt], sampling_params: Params | Seq[Params] | None,
                  use_tqdm: bool) -> list[RequestOutput]:
        prompts = _prompt_list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams | dict):
            params_list: list[Params | None] = [sampling_params] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(f"got {len(prompts)} prompts but {len(params_list)} sampling params")
        return self._run(prompts, params_list, use_tqdm, "generate")

    def embed(
        self, prompts: Seq[Prompt], pooling: str | None = None, normalize: bool | None = None,
        dimensions: int | None = None, use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """One vector per prompt (``output.embedding``, float32), in input order: the prompt runs
        through the layers and the final norm, never the LM head, and its final hidden states are
        pooled (``pooling`` "last", "mean" or "cls"; None: as the model's sentence-transformers
        files say, else "last"), truncated to ``dimensions`` and L2-normalised (``normalize``
        None: as the model says, else yes). Each request's KV blocks are freed in the step that
        computes its last token. A bad prompt comes back with ``error`` set, like ``generate``."""
        params = PoolingParams(pooling, normalize, dimensions)
        with objects_frozen_during_call():
            prompts = _prompt_list(prompts)
            return self._run(prompts, [params] * len(prompts), use_tqdm, "embed")

    def _run(self, prompts: list[Prompt], params_list: list, use_tqdm: bool, what: str) -> list[RequestOutput]:
        ids = [str(self._next_id + i) for i in range(len(prompts))]
        self._next_id += len(prompts)
        results: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc=what, disable=not use_tqdm)

        def refused(rid: str, prompt: Prompt, error: RequestError) -> None:
            prompt_ids = list(prompt) if not isinstance(prompt, str) else []
            results[rid] = RequestOutput(rid, prompt_ids, [], "", True, "error", error=str(error))
            bar.update(1)

        # Requests enter as the scheduler admits them: the first step does not wait for all of
        # them, and an overlapped engine adds the rest while the device runs.
        engine = self.engine
        try:
            engine.add_requests(zip(ids, prompts, params_list, strict=True), refused)
            while True:
                if engine.source_failure is not None:
                    raise engine.source_failure
                if not engine.has_unfinished():
                    break
                for out in engine.step():
                    results[out.request_id] = out
                    bar.update(1)
        except BaseException:
            engine.fail_requests(ids)  # this call's requests leave the engine with it
            raise
        finally:
            bar.close()
        return [results[rid] for rid in ids]

    def stats(self) -> dict[str, Any]:
        return self.engine.stats()

    def close(self) -> None:
        """Stop a tensor-parallel engine's worker processes (nothing to do for one process)."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

def _prompt_list(prompts: Seq[Prompt] | Prompt) -> list[Prompt]:
    """One prompt (a text or a list of token ids) or many, as a list of prompts."""
    if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
        return [prompts]  # type: ignore[list-item]
    return list(prompts)
