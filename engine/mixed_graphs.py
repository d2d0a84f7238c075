"""Piecewise CUDA graphs for steps that hold prefill chunks: the layers in graphs, attention eager.

A step with prefill chunks has a layout (how many decodes, how long each chunk) that changes
every step, so its attention cannot be frozen in a graph the way a decode step's is
(``cuda_graphs.DecodeGraphs``). Everything else in a layer (norms, projections, rotary, the MLP)
depends only on the token count. So for each padded token count the layers are captured as
``num_layers + 1`` graph pieces split at every attention call; a step replays piece 0, runs
layer 0's attention eagerly with the step's own metadata, replays piece 1, and so on. The eager
part is a few kernel launches per layer instead of some twenty, which is what made such steps
launch-bound (vLLM's piecewise graphs; its PR reports +47% on a MoE model).

At each cut the piece copies the layer's q, k and v into static buffers; the eager attention
reads those and writes a static output buffer that the next piece reads. Padding rows (token 0
at position 0) run through the pieces but never reach attention, the KV pool or the LM head,
which runs eagerly on the rows that sample. ``capture=False`` keeps the buffers, padding and the
eager attention on them but runs the layers eagerly: how the logic is tested without a GPU.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from engine.attention import AttentionBackend, AttentionMetadata
from engine.kv_cache import NO_SCALE

log = logging.getLogger(__name__)

# Padded token counts a graph is captured for, up to mixed_graph_max_tokens; past 4,096 every 512,
# so that a budget of 8,192 pads a step of 7,600 prompt tokens by under 1%.
DEFAULT_TOKEN_SIZES = (16, 32, 64, 128, 256, 384, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048,
                       2560, 3072, 3584, 4096, *range(4608, 8193, 512))


@dataclass
class _Buffers:
    """One attention shape's static tensors, shared by every layer of that shape and every size."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor


@dataclass
class _AttentionCut:
    """What a layer's attention needs at replay, besides the step's metadata."""

    buffers: _Buffers
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    scale: float
    window: int | None
    kv_scale: tuple[float, float]

    def run(self, backend: AttentionBackend, meta: AttentionMetadata) -> None:
        n = meta.num_tokens
        b = self.buffers
        backend.write_kv(b.k[:n], b.v[:n], self.k_cache, self.v_cache, meta, self.kv_scale)
        b.out[:n].copy_(backend.attend(b.q[:n], b.k[:n], b.v[:n], self.k_cache, self.v_cache, meta,
                                       self.scale, self.window, self.kv_scale))


class _CutRecorder(AttentionBackend):
    """Bound to every attention layer while the layers run on the static buffers: at each
    ``attend`` it copies q, k, v into them (inside the running piece), then, capturing, ends the
    piece, notes the cut and starts the next; with a step's ``meta``, runs the attention there
    (eager mode); with neither, attends to nothing (the warm-up that compiles the pieces)."""

    name = "cut-recorder"

    def __init__(self, owner: MixedGraphs, capturing: bool = False, meta: AttentionMetadata | None = None) -> None:
        self.owner = owner
        self.capturing = capturing
        self.meta = meta
        self.cuts: list[_AttentionCut] = []

    def write_kv(self, key, value, k_cache, v_cache, meta, kv_scale=NO_SCALE) -> None:
        """Deferred to the cut: the pool is written with the step's metadata, outside the graph."""

    def attend(self, query, key, value, k_cache, v_cache, meta, scale, window=None, kv_scale=NO_SCALE):
        b = self.owner.buffers_for(query, key)
        rows = query.shape[0]
        b.q[:rows].copy_(query)
        b.k[:rows].copy_(key)
        b.v[:rows].copy_(value)
        cut = _AttentionCut(b, k_cache, v_cache, scale, window, kv_scale)
        if self.capturing:
            self.cuts.append(cut)
            self.owner.next_piece()
        elif self.meta is not None:
            cut.run(self.owner.backend, self.meta)
        return b.out[:rows]


class MixedGraphs:
    def __init__(
        self, model, backend: AttentionBackend, max_tokens: int, device: str, capture: bool = True,
        token_sizes: tuple[int, ...] = DEFAULT_TOKEN_SIZES,
    ) -> None:
        self.model = model
        self.backend = backend
        self.device = torch.device(device)
        self.sizes = sorted({s for s in token_sizes if s < max_tokens} | {max_tokens})
        self.max_tokens = self.sizes[-1]
        self.capture = capture
        self.input_ids = torch.zeros(self.max_tokens, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(self.max_tokens, dtype=torch.int64, device=self.device)
        self._buffers: dict[tuple, _Buffers] = {}
        self.pieces: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.cuts: dict[int, list[_AttentionCut]] = {}
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.pool = None
        self._pieces: list = []
        self.steps = 0
        self.padded_tokens = 0  # rows run that were padding, over all steps
        self.capture_seconds = 0.0
        if capture:
            start = time.perf_counter()
            self._capture_all()
            self.capture_seconds = time.perf_counter() - start

    def buffers_for(self, query: torch.Tensor, key: torch.Tensor) -> _Buffers:
        shape = (tuple(query.shape[1:]), tuple(key.shape[1:]), query.dtype)
        if shape not in self._buffers:
            n, dev = self.max_tokens, self.device
            self._buffers[shape] = _Buffers(
                torch.zeros((n, *query.shape[1:]), dtype=query.dtype, device=dev),
                torch.zeros((n, *key.shape[1:]), dtype=key.dtype, device=dev),
                torch.zeros((n, *key.shape[1:]), dtype=key.dtype, device=dev),
                torch.zeros((n, *query.shape[1:]), dtype=query.dtype, device=dev),
            )
        return self._buffers[shape]

    def _bind(self, backend: AttentionBackend) -> None:
        for attn in self.model.attention_layers():
            attn.backend = backend

    def next_piece(self) -> None:
        """End the piece being captured and start the next (called at each attention cut)."""
        self._pieces[-1].capture_end()
        self._begin_piece()

    def _begin_piece(self) -> None:
        graph = torch.cuda.CUDAGraph()
        self._pieces.append(graph)
        graph.capture_begin(pool=self.pool)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        for size in reversed(self.sizes):  # largest first, so smaller sizes reuse its memory
            ids, pos, meta = self.input_ids[:size], self.positions[:size], _no_tokens(size, self.device)
            recorder = _CutRecorder(self)
            self._bind(recorder)
            try:
                self.model.hidden_states(ids, pos, meta)  # warm-up: compiles the pieces' kernels
                torch.cuda.synchronize()
                recorder.capturing = True
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    self._pieces = []
                    self._begin_piece()
                    try:
                        out = self.model.hidden_states(ids, pos, meta)
                    finally:
                        self._pieces[-1].capture_end()  # also after an error: leave the stream usable
                torch.cuda.current_stream().wait_stream(stream)
            finally:
                self._bind(self.backend)
            self.pieces[size], self.cuts[size], self.outputs[size] = self._pieces, recorder.cuts, out
        self._pieces = []
        torch.cuda.synchronize()

    def can_run(self, meta: AttentionMetadata) -> bool:
        return meta.num_tokens <= self.max_tokens

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
            logits_indices: torch.Tensor) -> torch.Tensor:
        """Logits of the rows ``logits_indices`` picks, for a step of at most ``max_tokens`` tokens."""
        n = meta.num_tokens
        size = next(s for s in self.sizes if s >= n)
        self.steps += 1
        self.padded_tokens += size - n
        self.input_ids[:n].copy_(input_ids)
        self.input_ids[n:size].zero_()
        self.positions[:n].copy_(positions)
        self.positions[n:size].zero_()
        if self.capture:
            pieces = self.pieces[size]
            for piece, cut in zip(pieces, self.cuts[size], strict=False):
                piece.replay()
                cut.run(self.backend, meta)
            pieces[-1].replay()
            x, residual = self.outputs[size]
        else:
            self._bind(_CutRecorder(self, meta=meta))
            try:
                x, residual = self.model.hidden_states(self.input_ids[:size], self.positions[:size], meta)
            finally:
                self._bind(self.backend)
        return self.model.logits(x, residual, logits_indices)


def _no_tokens(size: int, device: torch.device) -> AttentionMetadata:
    """Metadata of ``size`` rows for the warm-up and capture, which never hand it to a kernel."""
    zero = torch.zeros(1, dtype=torch.int32, device=device)
    return AttentionMetadata(
        query_start_loc=torch.tensor([0, size], dtype=torch.int32, device=device), seq_lens=zero + size,
        context_lens=zero, slot_mapping=torch.full((size,), -1, dtype=torch.int64, device=device),
        block_tables=torch.zeros(1, 1, dtype=torch.int32, device=device), block_size=16, num_decodes=0,
        max_query_len=size, max_seq_len=size, query_lens_host=[size], seq_lens_host=[size],
        context_lens_host=[0],
    )


def capture_mixed_graphs(model, backend: AttentionBackend, max_tokens: int, device: str) -> MixedGraphs | None:
    """The piecewise graphs, or None (steps with prefill chunks run eagerly) when ``max_tokens`` is
    0 or a model's layers cannot be captured (a host sync in them, say): a warning, not a failure."""
    if max_tokens <= 0:
        return None
    try:
        return MixedGraphs(model, backend, max_tokens, device)
    except RuntimeError as exc:
        log.warning("steps with prefill chunks run eagerly: capturing their graphs failed: %s", exc)
        torch.cuda.synchronize()
        return None
