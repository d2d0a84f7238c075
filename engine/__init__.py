"""tokenmill's inference engine: paged KV cache, continuous batching, prefix sharing,
chunked prefill and recompute preemption over a Llama-family model."""

from engine.config import EngineConfig
from engine.llm import LLM
from engine.llm_engine import LLMEngine
from engine.outputs import CompletionOutput, Logprob, RequestOutput
from engine.request_intake import RequestError
from engine.sampling_params import SamplingParams
from engine.structured_output import StructuredOutput

__all__ = [
    "LLM", "CompletionOutput", "EngineConfig", "LLMEngine", "Logprob", "RequestError", "RequestOutput",
    "SamplingParams", "StructuredOutput",
]
