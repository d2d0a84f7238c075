"""The device side: the KV pool and CUDA graphs, and one scheduled step run as one forward pass."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.attention import AttentionBackend, AttentionMetadata
from engine.config import EngineConfig
from engine.cuda_graphs import DecodeGraphs
from engine.cuda_profile import profile_cuda_blocks
from engine.device_features import DeviceFeatures
from engine.kv_cache import allocate_kv_pool, blocks_from_budget, bytes_per_block
from engine.models.llama import LlamaForCausalLM
from engine.scheduler import ScheduledBatch
from engine.sequence import Sequence


@dataclass
class StepLogits:
    """A forward pass's float32 logits: one row per sampling sequence (on the model's device),
    and for the sequences that ask for prompt logprobs, the rows of prompt positions ``first ...`` (CPU)."""

    sample_seqs: list[Sequence] = field(default_factory=list)
    logits: torch.Tensor | None = None  # [len(sample_seqs), vocab]
    prompt: list[tuple[Sequence, int, torch.Tensor]] = field(default_factory=list)

    @classmethod
    def merge(cls, parts: list[StepLogits]) -> StepLogits:
        rows = [p.logits for p in parts if p.sample_seqs]
        return cls(
            [s for p in parts for s in p.sample_seqs],
            torch.cat(rows) if rows else None,
            [x for p in parts for x in p.prompt],
        )


def prompt_logit_positions(seq: Sequence, computed: int, num_new: int) -> range:
    """Positions of this chunk whose logits give a prompt logprob (position p scores token p + 1)."""
    if not seq.needs_prompt_logits:
        return range(0)
    first = max(computed, seq.params.prompt_logprobs_start - 1)
    return range(first, min(computed + num_new, seq.num_prompt_tokens - 1))


class ModelRunner:
    """The device side of the engine: the model, its attention backend, the KV pool (sized,
    allocated and bound here) and the CUDA decode graphs. Turns a scheduled step into flat
    tensors, runs the model once and hands back the logits the step needs."""

    def __init__(
        self, model: LlamaForCausalLM, backend: AttentionBackend, config: EngineConfig, max_model_len: int,
        device: str, features: DeviceFeatures,
    ) -> None:
        self.model = model
        self.backend = backend
        self.block_size = config.block_size
        self.device = torch.device(device)
        self.kv_dtype = backend.kv_cache_dtype(config.torch_dtype)
        self.kv_pool: torch.Tensor | None = None
        self.decode_graphs: DecodeGraphs | None = None
        hf = model.config
        per_block = bytes_per_block(
            hf.num_hidden_layers, self.block_size, hf.num_key_value_heads, model.head_dim, self.kv_dtype
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

    def allocate_kv_pool(self, num_blocks: int) -> torch.Tensor:
        hf = self.model.config
        shape = self.backend.kv_cache_shape(num_blocks, self.block_size, hf.num_key_value_heads, self.model.head_dim)
        return allocate_kv_pool(hf.num_hidden_layers, shape, self.kv_dtype, self.device)

    def bind_kv_pool(self, kv_pool: torch.Tensor | None) -> None:
        """Point every attention layer at its slice of the pool (None: let go of it)."""
        self.kv_pool = kv_pool
        for i, attn in enumerate(self.model.attention_layers()):
            attn.backend = self.backend
            attn.k_cache = kv_pool[0, i] if kv_pool is not None else None
            attn.v_cache = kv_pool[1, i] if kv_pool is not None else None

    def prepare(self, batch: ScheduledBatch):
        """Build the step's tensors. Decodes go first so backends can batch them."""
        decodes = [it for it in batch.items if it.num_new_tokens == 1 and it.num_computed_tokens > 0]
        others = [it for it in batch.items if not (it.num_new_tokens == 1 and it.num_computed_tokens > 0)]
        ordered = decodes + others
        bs = self.block_size
        query_lens = [it.num_new_tokens for it in ordered]
        context_lens = [it.num_computed_tokens for it in ordered]
        seq_lens = [c + n for c, n in zip(context_lens, query_lens, strict=True)]
        input_ids: list[int] = []
        for it in ordered:
            c = it.num_computed_tokens
            input_ids.extend(it.seq.token_ids[c : c + it.num_new_tokens])
        max_blocks = max(-(-sl // bs) for sl in seq_lens)
        tables = [
            it.seq.block_table[:max_blocks] + [0] * (max_blocks - len(it.seq.block_table[:max_blocks]))
            for it in ordered
        ]

        dev = self.device
        q_lens = torch.tensor(query_lens, dtype=torch.int64)
        ctx = torch.tensor(context_lens, dtype=torch.int64)
        qsl = torch.zeros(len(ordered) + 1, dtype=torch.int64)
        torch.cumsum(q_lens, 0, out=qsl[1:])
        seq_index = torch.repeat_interleave(torch.arange(len(ordered)), q_lens)
        positions = torch.arange(int(qsl[-1])) - (qsl[:-1] - ctx)[seq_index]
        block_tables = torch.tensor(tables, dtype=torch.int64)
        slot_mapping = block_tables[seq_index, positions // bs] * bs + positions % bs

        sample_rows = [i for i, it in enumerate(ordered) if it.samples]
        indices = (qsl[1:][sample_rows] - 1).tolist()
        prompt_rows = []
        for i, it in enumerate(ordered if batch.wants_prompt_logits else ()):
            c = it.num_computed_tokens
            wanted = prompt_logit_positions(it.seq, c, it.num_new_tokens)
            if wanted:
                start = int(qsl[i]) - c  # flat row of position 0 of this sequence
                indices.extend(range(start + wanted.start, start + wanted.stop))
                prompt_rows.append((it.seq, wanted.start, len(wanted)))
        logits_indices = torch.tensor(indices, dtype=torch.int64)
        meta = AttentionMetadata(
            query_start_loc=qsl.to(dev, torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32).to(dev),
            context_lens=ctx.to(dev, torch.int32),
            slot_mapping=slot_mapping.to(dev),
            block_tables=block_tables.to(dev, torch.int32),
            block_size=bs,
            num_decodes=len(decodes),
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            query_lens_host=query_lens,
            seq_lens_host=seq_lens,
            context_lens_host=context_lens,
        )
        sample_seqs = [ordered[i].seq for i in sample_rows]
        return (
            torch.tensor(input_ids, dtype=torch.int64).to(dev),
            positions.to(dev),
            meta,
            logits_indices.to(dev),
            sample_seqs,
            prompt_rows,
        )

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> StepLogits:
        """Run one forward pass; the LM head runs only on the rows that sample or give a
        prompt logprob."""
        input_ids, positions, meta, logits_indices, sample_seqs, prompt_rows = self.prepare(batch)
        if self.decode_graphs is not None and self.decode_graphs.can_run(meta):
            logits = self.decode_graphs.run(input_ids, positions, meta, logits_indices)
        else:
            logits = self.model(input_ids, positions, meta, logits_indices)
        # Sampling rows stay on the device: a greedy step then copies token ids, not
        # [rows, vocab] floats (131 MB a step at 256 rows of a 128k vocabulary).
        out = StepLogits(sample_seqs, logits[: len(sample_seqs)])
        row = len(sample_seqs)
        for seq, first, count in prompt_rows:
            out.prompt.append((seq, first, logits[row : row + count].cpu()))
            row += count
        return out

    @torch.inference_mode()
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks ``source -> destination`` in every layer (forked samples)."""
        if not pairs:
            return
        axis = 2 + self.backend.block_axis
        src = torch.tensor([p[0] for p in pairs], device=self.kv_pool.device)
        dst = torch.tensor([p[1] for p in pairs], device=self.kv_pool.device)
        self.kv_pool.index_copy_(axis, dst, self.kv_pool.index_select(axis, src))
