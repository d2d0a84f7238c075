"""tokenmill's inference engine: paged KV cache, continuous batching, prefix sharing,
chunked prefill and recompute preemption over a Llama-family model."""

from engine.config import EngineConfig
from engine.llm import LLM
from engine.llm_engine import LLMEngine, RequestError
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

__all__ = ["LLM", "EngineConfig", "LLMEngine", "RequestError", "RequestOutput", "SamplingParams"]
