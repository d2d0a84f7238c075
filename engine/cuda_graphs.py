"""CUDA graphs for decode steps: capture once per padded batch size, replay every step.

A decode step launches hundreds of small kernels; on a GPU their launch cost rivals
the work. Each captured graph reads from static buffers, so a step copies its inputs
in, pads the batch up to the captured size (slot -1: write nothing; length 0: attend
to nothing) and replays. Host-side metadata is frozen at capture time (the longest
possible context), so the Triton decode kernel's split count is a constant of the graph.

``capture=False`` keeps the same static buffers and padding but runs the model eagerly;
that is how the padding logic is tested where there is no GPU.
"""

from __future__ import annotations

import time

import torch

from engine.attention import AttentionMetadata

# Past 256, steps of 64 rows: a 1,024-sequence engine's tail steps (300 sequences, say) would
# otherwise pad to 1,024 rows, and products of that many rows are compute-bound.
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024)


class DecodeGraphs:
    def __init__(
        self, model, block_size: int, max_model_len: int, max_num_seqs: int, device: str,
        capture: bool = True, batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES,
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.max_blocks = -(-max_model_len // block_size)
        self.batch_sizes = sorted({b for b in batch_sizes if b < max_num_seqs} | {max_num_seqs})
        self.max_batch = self.batch_sizes[-1]
        self.capture = capture
        dev = torch.device(device)
        n = self.max_batch
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=dev)
        self.block_tables = torch.zeros(n, self.max_blocks, dtype=torch.int32, device=dev)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.context_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=dev)
        self.logits_indices = torch.arange(n, dtype=torch.int64, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None
        self.padded_steps = 0  # steps whose batch was padded up to a captured size
        self.steps = 0
        self.replays: dict[int, int] = dict.fromkeys(self.batch_sizes, 0)  # steps run at each size
        self.capture_seconds = 0.0
        if capture:
            start = time.perf_counter()
            self._capture_all()
            self.capture_seconds = time.perf_counter() - start

    def _meta(self, size: int) -> AttentionMetadata:
        """Metadata over the static buffers; host values are the capture-time constants."""
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            context_lens=self.context_lens[:size],
            slot_mapping=self.slot_mapping[:size],
            block_tables=self.block_tables[:size],
            block_size=self.block_size,
            num_decodes=size,
            max_query_len=1,
            max_seq_len=self.max_model_len,
            query_lens_host=[1] * size,
            seq_lens_host=[self.max_model_len] * size,
            context_lens_host=[self.max_model_len - 1] * size,
        )

    def _forward(self, size: int) -> torch.Tensor:
        return self.model(
            self.input_ids[:size], self.positions[:size], self._meta(size), self.logits_indices[:size]
        )

    @torch.inference_mode()
    def _capture_all(self) -> None:
        for size in reversed(self.batch_sizes):  # largest first, so smaller graphs reuse its memory pool
            self._forward(size)  # warm-up: compiles the Triton kernels outside capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.outputs[size] = self._forward(size)
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()

    def can_run(self, meta: AttentionMetadata) -> bool:
        return (
            meta.num_decodes == meta.num_seqs
            and meta.num_seqs <= self.max_batch
            and meta.block_tables.shape[1] <= self.max_blocks
        )

    @torch.inference_mode()
    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Logits of the sampling rows of a step whose every sequence has one query token.

        Such a step can hold a one-token prefill chunk that does not sample yet, so the rows
        are picked by ``logits_indices`` exactly as in the eager forward."""
        b = meta.num_seqs
        size = next(s for s in self.batch_sizes if s >= b)
        self.steps += 1
        self.padded_steps += size > b
        self.replays[size] += 1
        width = meta.block_tables.shape[1]
        self.input_ids[:b].copy_(input_ids)
        self.positions[:b].copy_(positions)
        self.slot_mapping[:b].copy_(meta.slot_mapping)
        self.slot_mapping[b:size].fill_(-1)
        self.seq_lens[:b].copy_(meta.seq_lens)
        self.seq_lens[b:size].zero_()
        self.context_lens[:b].copy_(meta.context_lens)
        self.block_tables[:b, :width].copy_(meta.block_tables)
        self.block_tables[:b, width:].zero_()
        if self.capture:
            self.graphs[size].replay()
            return self.outputs[size][logits_indices]
        return self._forward(size)[logits_indices]
