"""The one attention interface the model code calls; backends plug in behind it."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from engine.attention.metadata import AttentionMetadata
from engine.kv_cache import NO_SCALE


class AttentionBackend(ABC):
    """Writes a step's keys/values into the paged pool, then attends through block tables.

    A backend owns the layout of one layer's pool (``kv_cache_shape``). The default is
    ``[num_blocks, block_size, num_kv_heads, head_dim]``, contiguous; block ``b`` holds
    positions ``b_index * block_size ...`` of whichever sequence's table names it.
    """

    name: str = "abstract"
    block_axis: int = 0  # where ``num_blocks`` sits in ``kv_cache_shape``

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple:
        return (num_blocks, block_size, num_kv_heads, head_dim)

    def kv_cache_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        return model_dtype

    @abstractmethod
    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        meta: AttentionMetadata, kv_scale: tuple[float, float] = NO_SCALE,
    ) -> None:
        """Scatter ``key``/``value`` ``[T, num_kv_heads, head_dim]`` to ``meta.slot_mapping``
        (an FP8 pool stores them divided by ``kv_scale``'s key and value scales: ``engine/kv_cache.py``)."""

    @abstractmethod
    def attend(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
        k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
        window: int | None = None, kv_scale: tuple[float, float] = NO_SCALE,
    ) -> torch.Tensor:
        """Causal attention of ``query`` ``[T, num_heads, head_dim]`` over each sequence's
        cached context plus its new tokens; returns ``[T, num_heads, head_dim]``.
        ``key``/``value`` are this step's new keys (already written to the pool). ``window``:
        a query at position ``p`` sees only keys at ``p - window + 1 .. p`` (HF's sliding
        window), None: every earlier key. ``kv_scale``: what an FP8 pool's keys and values are
        multiplied by when read."""


class Attention(torch.nn.Module):
    """The attention layer as the model sees it: bound to its layer's slice of the pool."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 window: int | None = None) -> None:
        super().__init__()
        self.window = window  # sliding window of this layer (None: full attention)
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.backend: AttentionBackend | None = None
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None
        self.kv_scale = NO_SCALE  # this layer's FP8 pool scales (key, value); plain floats, fixed once bound

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        assert self.backend is not None and self.k_cache is not None, "KV cache not bound"
        self.backend.write_kv(k, v, self.k_cache, self.v_cache, meta, self.kv_scale)
        return self.backend.attend(q, k, v, self.k_cache, self.v_cache, meta, self.scale, self.window, self.kv_scale)
