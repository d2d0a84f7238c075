"""Engine settings, checked once at start-up.

Plain data: torch is imported only where a setting becomes a torch value, so job specs
derive their ``[model]`` table from this class without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.model_registry import DEFAULT_MODEL

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float16")  # torch dtype names
QUANTIZATIONS = ("auto", "none")  # auto: a quantized checkpoint runs quantized (CPU); none: dequantised to dtype
# auto: the attention backend's choice for the model dtype; fp8: float8_e4m3fn with one scale per
# layer for keys and one for values (engine/kv_cache.py), half the bytes of a bfloat16 pool
KV_CACHE_DTYPES = ("auto", "fp8")


@dataclass
class EngineConfig:
    model: str = DEFAULT_MODEL
    revision: str | None = None  # a Hub model's branch, tag or commit (engine/hub_models.py); None: main
    dtype: str = "float32"  # activations, and the weights of a float checkpoint
    quantization: str = "auto"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    attention_backend: str = "auto"  # auto | torch | triton
    block_size: int = 16
    enable_prefix_caching: bool = True
    # None: the device's default (engine/device_features.py, ``batch_limits``): 256 sequences and
    # 2,048 tokens a step, 1,024 and 8,192 on a GPU of 70 GiB or more other than an A100 (vLLM's rule).
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    num_kv_blocks: int | None = None  # None: size the pool from memory
    kv_cache_memory_gb: float = 2.0  # CPU budget for the KV pool when num_kv_blocks is None
    kv_cache_dtype: str = "auto"  # auto | fp8 (KV_CACHE_DTYPES)
    gpu_memory_utilization: float = 0.90
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    scheduling: str = "continuous"  # continuous | static
    kv_allocation: str = "paged"  # paged | contiguous
    num_threads: int | None = None  # torch intra-op threads on CPU; None: one per core
    # CUDA: None (default) or False = capture CUDA graphs for decode steps (Triton backend only);
    # True = eager. See engine/device_features.py.
    enforce_eager: bool | None = None
    # CUDA graphs on: steps with prefill chunks of up to this many tokens replay piecewise graphs
    # (attention eager between them; engine/mixed_graphs.py). 0: such steps run eagerly.
    mixed_graph_max_tokens: int = 4096
    compile: bool = False  # torch.compile the model
    # Schedule and launch step t+1 while step t runs, its sampled tokens filled in on the device.
    # None: on where the device runs apart from the host (CUDA), off on the CPU (nothing to overlap).
    async_scheduling: bool | None = None
    seed: int = 0
    # Split the model over this many devices of one machine, one process each (engine/parallel):
    # GPUs device..device+N-1 (NCCL), or N processes sharing the CPU's cores (gloo).
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        if self.dtype == "auto":
            self.dtype = "float32"
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {list(QUANTIZATIONS)}, got {self.quantization!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {list(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.mixed_graph_max_tokens < 0:
            raise ValueError(f"mixed_graph_max_tokens must be >= 0, got {self.mixed_graph_max_tokens}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype)

    def resolved_device(self) -> str:
        if self.device == "auto":
            import torch

            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device
