"""Turns one scheduled step into flat tensors, runs the model once and returns logits."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.attention import AttentionBackend, AttentionMetadata
from engine.models.llama import LlamaForCausalLM
from engine.sequence import Sequence


@dataclass
class StepLogits:
    """A forward pass's float32 logits (CPU): one row per sampling sequence, and for the
    sequences that ask for prompt logprobs, the rows of prompt positions ``first ...``."""

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
    def __init__(
        self, model: LlamaForCausalLM, backend: AttentionBackend, kv_pool: torch.Tensor, block_size: int,
        device: str,
    ) -> None:
        self.model = model
        self.backend = backend
        self.block_size = block_size
        self.device = torch.device(device)
        self.bind_kv_pool(kv_pool)
        self.decode_graphs = None  # engine.cuda_graphs.DecodeGraphs, set by the engine on CUDA

    def bind_kv_pool(self, kv_pool: torch.Tensor) -> None:
        self.kv_pool = kv_pool
        for i, attn in enumerate(self.model.attention_layers()):
            attn.backend = self.backend
            attn.k_cache = kv_pool[0, i]
            attn.v_cache = kv_pool[1, i]

    def prepare(self, items: list[tuple[Sequence, int]]):
        """Build the step's tensors. Decodes go first so backends can batch them."""
        decodes = [it for it in items if it[1] == 1 and it[0].num_computed_tokens > 0]
        others = [it for it in items if not (it[1] == 1 and it[0].num_computed_tokens > 0)]
        ordered = decodes + others
        bs = self.block_size
        query_lens = [n for _, n in ordered]
        context_lens = [s.num_computed_tokens for s, _ in ordered]
        seq_lens = [c + n for c, n in zip(context_lens, query_lens, strict=True)]
        input_ids: list[int] = []
        for s, n in ordered:
            c = s.num_computed_tokens
            input_ids.extend(s.token_ids[c : c + n])
        max_blocks = max(-(-sl // bs) for sl in seq_lens)
        tables = [s.block_table[:max_blocks] + [0] * (max_blocks - len(s.block_table[:max_blocks])) for s, _ in ordered]

        dev = self.device
        q_lens = torch.tensor(query_lens, dtype=torch.int64)
        ctx = torch.tensor(context_lens, dtype=torch.int64)
        qsl = torch.zeros(len(ordered) + 1, dtype=torch.int64)
        torch.cumsum(q_lens, 0, out=qsl[1:])
        seq_index = torch.repeat_interleave(torch.arange(len(ordered)), q_lens)
        positions = torch.arange(int(qsl[-1])) - (qsl[:-1] - ctx)[seq_index]
        block_tables = torch.tensor(tables, dtype=torch.int64)
        slot_mapping = block_tables[seq_index, positions // bs] * bs + positions % bs

        sample_rows = [i for i, (s, n) in enumerate(ordered) if s.num_computed_tokens + n == s.num_tokens]
        indices = (qsl[1:][sample_rows] - 1).tolist()
        prompt_rows = []
        for i, (s, n) in enumerate(ordered):
            c = s.num_computed_tokens
            wanted = prompt_logit_positions(s, c, n)
            if wanted:
                start = int(qsl[i]) - c  # flat row of position 0 of this sequence
                indices.extend(range(start + wanted.start, start + wanted.stop))
                prompt_rows.append((s, wanted.start, len(wanted)))
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
        sample_seqs = [ordered[i][0] for i in sample_rows]
        return (
            torch.tensor(input_ids, dtype=torch.int64).to(dev),
            positions.to(dev),
            meta,
            logits_indices.to(dev),
            sample_seqs,
            prompt_rows,
        )

    @torch.inference_mode()
    def execute(self, items: list[tuple[Sequence, int]]) -> StepLogits:
        """Run one forward pass; the LM head runs only on the rows that sample or give a
        prompt logprob."""
        input_ids, positions, meta, logits_indices, sample_seqs, prompt_rows = self.prepare(items)
        if self.decode_graphs is not None and self.decode_graphs.can_run(meta):
            logits = self.decode_graphs.run(input_ids, positions, meta, logits_indices).cpu()
        else:
            logits = self.model(input_ids, positions, meta, logits_indices).cpu()
        out = StepLogits(sample_seqs, logits[: len(sample_seqs)])
        row = len(sample_seqs)
        for seq, first, count in prompt_rows:
            out.prompt.append((seq, first, logits[row : row + count]))
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
