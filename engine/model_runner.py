"""The device side: the KV pool and CUDA graphs, and one scheduled step run as one forward pass."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from engine.attention import AttentionBackend
from engine.block_table_rows import BlockTableRows
from engine.config import EngineConfig
from engine.cuda_graphs import DecodeGraphs
from engine.cuda_profile import profile_cuda_blocks
from engine.device_features import DeviceFeatures
from engine.kv_cache import KV_FP8, allocate_kv_pool, blocks_from_budget, bytes_per_block, kv_pool_dtype
from engine.mixed_graphs import MixedGraphs, capture_mixed_graphs
from engine.models.llama import LlamaForCausalLM
from engine.sampler import sample
from engine.scheduled_batch import ScheduledBatch
from engine.sequence import Sequence
from engine.step_inputs import StepInputs, build_step_inputs, token_rows_by_table_row


@dataclass
class StepLogits:
    """A forward pass's float32 logits, on the model's device: one row per sampling sequence, and
    for the sequences that ask for prompt logprobs, the rows of prompt positions ``first ...``."""

    sample_seqs: list[Sequence] = field(default_factory=list)
    logits: torch.Tensor | None = None  # [len(sample_seqs), vocab]
    prompt: list[tuple[Sequence, int, torch.Tensor]] = field(default_factory=list)
    # embedding requests: (seq, first position, float32 final hidden states of positions first...)
    pooled: list[tuple[Sequence, int, torch.Tensor]] = field(default_factory=list)

    @classmethod
    def merge(cls, parts: list[StepLogits]) -> StepLogits:
        rows = [p.logits for p in parts if p.sample_seqs]
        return cls(
            [s for p in parts for s in p.sample_seqs],
            torch.cat(rows) if rows else None,
            [x for p in parts for x in p.prompt],
            [x for p in parts for x in p.pooled],
        )


@dataclass
class InFlightStep:
    """A launched step whose tokens are still on their way back (async scheduling)."""

    sample_seqs: list[Sequence]
    token_rows: np.ndarray  # per BlockTableRows row, its sequence's row of ``tokens`` (-1: none)
    tokens: torch.Tensor  # int64 token ids on the device, one per sampling sequence
    host: torch.Tensor  # their host copy (pinned on CUDA), valid once ``wait`` returns
    event: object | None  # marks the end of the step's device work (ModelRunner.record_event)

    def wait(self) -> list[int]:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


class ModelRunner:
    """The device side of the engine: the model, its attention backend, the KV pool (sized,
    allocated and bound here) and the CUDA decode graphs. Turns a scheduled step into flat
    tensors, runs the model once and hands back the logits the step needs."""

    # CUDA: the model hands over its logits in its own dtype (``CausalLM.float_logits``); greedy
    # rows take their argmax there and only drawing rows are widened. H100, 1B shape: the float32
    # copy and the wider argmax were 3.4% of the device time (bench/gpu/gpu_async.py profile).
    argmax_in_model_dtype = True

    def __init__(
        self, model: LlamaForCausalLM, backend: AttentionBackend, config: EngineConfig, max_model_len: int,
        device: str, features: DeviceFeatures,
    ) -> None:
        self.model = model
        self.backend = backend
        self.block_size = config.block_size
        self.device = torch.device(device)
        model.float_logits = not (self.device.type == "cuda" and self.argmax_in_model_dtype)
        self.table_rows = BlockTableRows(-(-max_model_len // config.block_size), rows=config.max_num_seqs)
        self.kv_dtype = kv_pool_dtype(config.kv_cache_dtype, backend.kv_cache_dtype(config.torch_dtype))
        if self.kv_dtype == KV_FP8 and getattr(model, "kv_cache_scales", None):  # a checkpoint's calibrated scales
            for attn, scales in zip(model.attention_layers(), model.kv_cache_scales, strict=True):
                attn.kv_scale = scales
        self.kv_pool: torch.Tensor | None = None
        self.decode_graphs: DecodeGraphs | None = None
        self.mixed_graphs: MixedGraphs | None = None
        hf = model.config
        # the heads this process's layers hold (a tensor-parallel rank holds its share)
        self.num_kv_heads = model.attention_layers()[0].num_kv_heads
        per_block = bytes_per_block(
            hf.num_hidden_layers, self.block_size, self.num_kv_heads, model.head_dim, self.kv_dtype
        )
        if config.num_kv_blocks is not None:
            self.num_kv_blocks = config.num_kv_blocks
        elif features.profile_kv_pool:
            self.num_kv_blocks = profile_cuda_blocks(self, config.max_num_batched_tokens, max_model_len,
                                                     config.gpu_memory_utilization, per_block)
        else:
            self.num_kv_blocks = blocks_from_budget(config.kv_cache_memory_gb * 2**30, per_block)
        self.bind_kv_pool(self.allocate_kv_pool(self.num_kv_blocks))
        if config.compile:
            self.model = torch.compile(model, dynamic=True)
        if features.cuda_graphs:
            self.decode_graphs = DecodeGraphs(model, self.block_size, max_model_len, config.max_num_seqs, device)
            self.mixed_graphs = capture_mixed_graphs(
                model, backend, min(config.mixed_graph_max_tokens, config.max_num_batched_tokens), device)

    def allocate_kv_pool(self, num_blocks: int) -> torch.Tensor:
        hf = self.model.config
        shape = self.backend.kv_cache_shape(num_blocks, self.block_size, self.num_kv_heads, self.model.head_dim)
        return allocate_kv_pool(hf.num_hidden_layers, shape, self.kv_dtype, self.device)

    def bind_kv_pool(self, kv_pool: torch.Tensor | None) -> None:
        """Point every attention layer at its slice of the pool (None: let go of it)."""
        self.kv_pool = kv_pool
        for i, attn in enumerate(self.model.attention_layers()):
            attn.backend = self.backend
            attn.k_cache = kv_pool[0, i] if kv_pool is not None else None
            attn.v_cache = kv_pool[1, i] if kv_pool is not None else None

    def prepare(self, batch: ScheduledBatch, previous: InFlightStep | None = None) -> StepInputs:
        """The step's tensors on the device (placeholders filled from ``previous``'s tokens)."""
        if previous is None:
            return build_step_inputs(batch, self.block_size, self.device, self.table_rows)
        return build_step_inputs(batch, self.block_size, self.device, self.table_rows, previous.token_rows,
                                 previous.tokens)

    def _forward(self, inputs: StepInputs) -> torch.Tensor:
        meta = inputs.meta
        if self.decode_graphs is not None and self.decode_graphs.can_run(meta):
            return self.decode_graphs.run(inputs.input_ids, inputs.positions, meta, inputs.logits_indices)
        if self.mixed_graphs is not None and self.mixed_graphs.can_run(meta):
            return self.mixed_graphs.run(inputs.input_ids, inputs.positions, meta, inputs.logits_indices)
        return self.model(inputs.input_ids, inputs.positions, meta, inputs.logits_indices)

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> StepLogits:
        """Run one forward pass; the LM head runs only on the rows that sample or give a
        prompt logprob."""
        inputs = self.prepare(batch)
        hidden = None
        if inputs.pool_rows:
            logits, hidden = self._forward_pooling(inputs)
        else:
            logits = self._forward(inputs)
        logits = logits.float()  # logprobs, grammar masks and forks read float32
        if not logits.is_cuda and (event := self.record_event()) is not None:
            event.synchronize()  # a simulated device (the host-overhead bench); CUDA syncs on reading tokens
        # Sampling rows stay on the device: a greedy step then copies token ids, not
        # [rows, vocab] floats (131 MB a step at 256 rows of a 128k vocabulary).
        n = len(inputs.sample_seqs)
        out = StepLogits(inputs.sample_seqs, logits[:n])
        row = n
        for seq, first, count in inputs.prompt_rows:
            out.prompt.append((seq, first, logits[row : row + count]))  # stay on the device
            row += count
        row = 0
        for seq, first, count in inputs.pool_rows:
            out.pooled.append((seq, first, hidden[row : row + count]))
            row += count
        return out

    def _forward_pooling(self, inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """A step with embedding requests, eagerly: the layers once, then the LM head on the
        sampling rows and only the final norm on the rows that pool (float32)."""
        model = getattr(self.model, "_orig_mod", self.model)  # under torch.compile, the module itself
        x, residual = model.hidden_states(inputs.input_ids, inputs.positions, inputs.meta)
        logits = model.logits(x, residual, inputs.logits_indices)
        rows = inputs.pool_indices
        hidden, _ = model.norm.forward(x[rows], residual[rows])
        return logits, hidden.float()

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch, previous: InFlightStep | None) -> InFlightStep:
        """Enqueue a step whose sampling needs no host state (no grammar, logprobs or forks):
        inputs, forward pass and sampling all go to the device, and the token ids start their
        copy back; nothing here waits for the device."""
        inputs = self.prepare(batch, previous)
        logits = self._forward(inputs)
        tokens = self.sample_tokens(logits, inputs.sample_seqs)
        host = tokens
        if tokens.is_cuda:
            host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            host.copy_(tokens, non_blocking=True)
        token_rows = token_rows_by_table_row(inputs.sample_table_rows)
        return InFlightStep(inputs.sample_seqs, token_rows, tokens, host, self.record_event())

    def sample_tokens(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Token ids where the logits are (``engine.sampler``: the same draws on every device)."""
        return sample(logits, seqs)

    def record_event(self):
        """A marker after the device work queued so far, whose ``synchronize()`` waits for that work:
        a CUDA event; None on the CPU, where work is done when the call returns. The host-overhead
        bench replaces this with a simulated device's marker."""
        if self.device.type != "cuda":
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    @torch.inference_mode()
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks ``source -> destination`` in every layer (forked samples)."""
        if not pairs:
            return
        axis = 2 + self.backend.block_axis
        src = torch.tensor([p[0] for p in pairs], device=self.kv_pool.device)
        dst = torch.tensor([p[1] for p in pairs], device=self.kv_pool.device)
        self.kv_pool.index_copy_(axis, dst, self.kv_pool.index_select(axis, src))
