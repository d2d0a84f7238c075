"""tokenmill's inference engine: paged KV cache, continuous batching, prefix sharing,
chunked prefill and recompute preemption over a Llama-family model.

The public names load on first use, so the torch-free parts (scheduler, block manager,
stop conditions) import without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_PUBLIC = {
    "LLM": "engine.llm",
    "CompletionOutput": "engine.outputs",
    "EngineConfig": "engine.config",
    "LLMEngine": "engine.llm_engine",
    "PoolingParams": "engine.pooling_params",
    "Logprob": "engine.outputs",
    "RequestError": "engine.request_intake",
    "RequestOutput": "engine.outputs",
    "SamplingParams": "engine.sampling_params",
    "StructuredOutput": "engine.structured_output",
}
__all__ = [
    "LLM", "CompletionOutput", "EngineConfig", "LLMEngine", "Logprob", "PoolingParams", "RequestError", "RequestOutput",
    "SamplingParams", "StructuredOutput",
]

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.llm import LLM
    from engine.llm_engine import LLMEngine
    from engine.outputs import CompletionOutput, Logprob, RequestOutput
    from engine.pooling_params import PoolingParams
    from engine.request_intake import RequestError
    from engine.sampling_params import SamplingParams
    from engine.structured_output import StructuredOutput


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
