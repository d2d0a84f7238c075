"""Counters a user reads after a run: KV use and waste, prefix hits, preemptions, steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.block_manager import BlockManager
from engine.scheduled_batch import ScheduledBatch
from engine.scheduler import Scheduler


@dataclass
class EngineStats:
    num_blocks: int
    block_size: int
    peak_used_blocks: int = 0
    kv_waste_at_peak: float = 0.0
    peak_running_seqs: int = 0
    prompt_tokens_computed: int = 0
    decode_tokens: int = 0
    steps: int = 0
    running_seq_steps: int = 0  # sum over steps of running sequences, for the mean
    forked_samples: int = 0  # samples 1..n-1 of n > 1 requests, forked from sample 0
    fork_shared_blocks: int = 0  # full prompt KV blocks those samples share instead of recomputing
    fork_copied_blocks: int = 0  # partial last blocks copied for them
    _waste_measured_at: int = 0  # used blocks when kv_waste_at_peak was last measured

    def on_fork(self, shared_blocks: int, copied: object | None) -> None:
        self.forked_samples += 1
        self.fork_shared_blocks += shared_blocks
        self.fork_copied_blocks += copied is not None

    def on_schedule(self, batch: ScheduledBatch, scheduler: Scheduler) -> None:
        if not batch:
            return
        self.steps += 1
        running = len(scheduler.running)
        self.running_seq_steps += running
        self.peak_running_seqs = max(self.peak_running_seqs, running)
        self.prompt_tokens_computed += batch.num_prompt_tokens  # recomputed outputs of preempted ones too

    def on_computed(self, scheduler: Scheduler, bm: BlockManager) -> None:
        """After the forward pass, before finished sequences free their blocks. The waste is a
        loop over the running sequences, so it is measured when the peak has grown by 1/16 of
        itself since it was last measured (a few hundred times in a run, not at every step of a
        growing batch)."""
        used = bm.num_used_blocks
        if used > self.peak_used_blocks:
            self.peak_used_blocks = used
            if used >= self._waste_measured_at + max(1, self._waste_measured_at // 16):
                self._waste_measured_at = used
                unfilled = sum(bm.unfilled_slots(s) for s in scheduler.running)
                self.kv_waste_at_peak = unfilled / (used * self.block_size)

    def as_dict(self, scheduler: Scheduler, bm: BlockManager) -> dict[str, Any]:
        return {
            "kv_blocks_total": self.num_blocks,
            "kv_block_size": self.block_size,
            "kv_blocks_peak_used": self.peak_used_blocks,
            "kv_blocks_used_now": bm.num_used_blocks,
            "kv_peak_usage": self.peak_used_blocks / self.num_blocks,
            "kv_waste_at_peak": self.kv_waste_at_peak,
            "peak_running_seqs": self.peak_running_seqs,
            "mean_running_seqs": self.running_seq_steps / self.steps if self.steps else 0.0,
            "prefix_cache_query_tokens": scheduler.prefix_query_tokens,
            "prefix_cache_hit_tokens": scheduler.prefix_hit_tokens,
            "prompt_tokens_computed": self.prompt_tokens_computed,
            "decode_tokens": self.decode_tokens,
            "preemptions": scheduler.num_preemptions,
            "forked_samples": self.forked_samples,
            "fork_shared_blocks": self.fork_shared_blocks,
            "fork_copied_blocks": self.fork_copied_blocks,
            "steps": self.steps,
        }
