"""Paged KV-cache bookkeeping: block ids, reference counts, LRU reuse (the prefix hashes are
``prefix_cache.py``'s).

Plain Python over ids, hashes and counts, so it is testable without torch. The
tensors that hold the keys and values live in ``kv_cache.py``; a block id here is an
index into them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence as Seq

from engine.prefix_cache import RELEASED, PrefixCache, hash_block
from engine.sequence import Sequence

__all__ = ["ALLOCATION_POLICIES", "RELEASED", "BlockManager", "hash_block"]

ALLOCATION_POLICIES = ("paged", "contiguous")


class BlockManager:
    """Owns every KV block of the pool.

    * A block with ``ref_count > 0`` belongs to one or more running sequences.
    * A block with ``ref_count == 0`` sits in ``free_queue``; if it still carries a hash
      it can be revived by a later request with the same prefix until it is evicted.
    * Eviction takes the front of ``free_queue`` (least recently freed first). Blocks
      without a hash are put at the front, since nobody can reuse them.
    * With a sliding ``window`` (a model whose every layer attends to at most that many
      positions), blocks that fall wholly before the window of a sequence's next query are
      given back as it advances (their table entries become ``RELEASED``), so the KV a
      sequence holds follows its window, not its length. A released block keeps its hash in
      the free queue: a later request with the same prefix can still revive it.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        allocation: str = "paged",
        window: int | None = None,
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if allocation not in ALLOCATION_POLICIES:
            raise ValueError(f"kv_allocation must be one of {ALLOCATION_POLICIES}, got {allocation!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.allocation = allocation
        self.window = window if allocation == "paged" else None  # a contiguous reservation is kept whole
        self.ref_counts = [0] * num_blocks
        self.prefix = PrefixCache(num_blocks, block_size, enable_prefix_caching)
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))

    # ---- queries -------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _target_blocks(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks the sequence must own once ``num_tokens`` tokens are in the cache."""
        if self.allocation == "contiguous":
            return max(self.blocks_for_tokens(seq.max_total_tokens), self.blocks_for_tokens(num_tokens))
        return self.blocks_for_tokens(num_tokens)

    # ---- prefix cache (engine/prefix_cache.py) ----------------------------------------
    @property
    def enable_prefix_caching(self) -> bool:
        return self.prefix.enabled

    @enable_prefix_caching.setter
    def enable_prefix_caching(self, enabled: bool) -> None:
        """Switched between runs too (bench/bench_engine.py)."""
        self.prefix.enabled = enabled

    @property
    def block_hashes(self) -> list[bytes | None]:
        """Each block's published hash (None: serves no prefix)."""
        return self.prefix.block_hashes

    @property
    def hash_to_block(self) -> dict[bytes, int]:
        return self.prefix.hash_to_block

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids holding the longest cached prefix of ``seq`` (``PrefixCache.find``)."""
        return self.prefix.find(seq)

    def publish_computed(self, seq: Sequence) -> None:
        """Publish every full block of the sequence's computed tokens: it is ending (stopped, or
        drained at its length limit) and makes no later call, so a block its last decodes filled
        would otherwise go unpublished. Only for a sequence whose steps succeeded: a failed
        step's blocks hold keys that were never written (``forget_sequences``)."""
        if seq.block_table:
            self.prefix.publish(seq, seq.num_computed_tokens + 1)

    def forget_sequences(self, seqs: Seq[Sequence]) -> None:
        """Forget the blocks of sequences whose step failed; they publish them again once recomputed."""
        for seq in seqs:
            self.forget_blocks(seq.block_table)
            seq.num_registered_blocks = 0
            seq.slots_ready_until = 0

    def forget_blocks(self, block_ids: Seq[int]) -> None:
        """Drop the prefix-cache entries of blocks whose contents can no longer be trusted."""
        self.prefix.forget(block_ids)

    # ---- allocation ----------------------------------------------------------------
    def _pop_free_block(self) -> int:
        """Take the block at the front of the free queue, forgetting any prefix it still served
        (a decoding sequence takes one per block: no lists on that path)."""
        block = self.free_queue.popitem(last=False)[0]
        if self.prefix.block_hashes[block] is not None:
            self.prefix.forget((block,))
        self.ref_counts[block] = 1
        return block

    def _pop_free_blocks(self, count: int) -> list[int]:
        return [self._pop_free_block() for _ in range(count)]

    def can_admit(self, seq: Sequence, cached_blocks: Seq[int], num_new_tokens: int) -> bool:
        reviving = sum(1 for b in cached_blocks if self.ref_counts[b] == 0)
        need = self._target_blocks(seq, len(cached_blocks) * self.block_size + num_new_tokens) - len(cached_blocks)
        return need <= self.num_free_blocks - reviving

    def admit(self, seq: Sequence, cached_blocks: Seq[int], num_new_tokens: int) -> bool:
        """Give a waiting sequence its cached prefix blocks plus room for ``num_new_tokens``."""
        if seq.block_table:
            raise RuntimeError(f"request {seq.request_id}: admitted while still holding blocks")
        if not self.can_admit(seq, cached_blocks, num_new_tokens):
            return False
        for block in cached_blocks:
            if self.ref_counts[block] == 0:
                del self.free_queue[block]
            self.ref_counts[block] += 1
        seq.block_table = list(cached_blocks)
        seq.block_table_version += 1
        seq.num_registered_blocks = len(cached_blocks)
        seq.num_computed_tokens = len(cached_blocks) * self.block_size
        allocated = self.allocate_slots(seq, num_new_tokens)
        assert allocated
        return True

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make room for the next ``num_new_tokens`` tokens; False if the pool is too full.
        Nothing to do while they stay within ``seq.slots_ready_until``: the scheduler skips the
        call then (15 of 16 decode steps: the call that adds a block publishes the one before)."""
        total = seq.num_computed_tokens + num_new_tokens
        if total <= seq.slots_ready_until:
            return True
        table = seq.block_table
        if total > len(table) * self.block_size:
            need = self._target_blocks(seq, total) - len(table)
            if need > len(self.free_queue):
                return False
            if need == 1:  # a decoding sequence's next block, without a list
                table.append(self._pop_free_block())
            else:
                table.extend(self._pop_free_blocks(need))
        self.prefix.publish(seq, total)
        self._release_out_of_window(seq)
        self._set_slots_ready(seq)
        return True

    def _set_slots_ready(self, seq: Sequence) -> None:
        """``seq.slots_ready_until``: the most tokens it can hold with no block to add and none
        to publish (``PrefixCache.publish``'s rule for block ``num_registered_blocks``: filled, if it holds
        prompt tokens only, else passed; paged, passing a block is needing the next); with a
        sliding window every step may give blocks back, so 0."""
        if self.window is not None:
            seq.slots_ready_until = 0
            return
        limit = len(seq.block_table) * self.block_size
        if self.enable_prefix_caching:
            end = (seq.num_registered_blocks + 1) * self.block_size  # where the next block to publish ends
            limit = min(limit, end - 1 if end <= len(seq.prompt_token_ids) else end)
        seq.slots_ready_until = limit

    def _release_out_of_window(self, seq: Sequence) -> None:
        """Give back the blocks wholly before the first position the sequence's next query
        sees (``num_computed_tokens - window + 1``): no later step reads them."""
        if self.window is None:
            return
        first_seen = seq.num_computed_tokens - self.window + 1
        end = min(max(0, first_seen) // self.block_size, len(seq.block_table))
        if end <= seq.released_blocks:
            return
        for i in range(seq.released_blocks, end):
            block = seq.block_table[i]
            if block != RELEASED:
                self._unref(block)
                seq.block_table[i] = RELEASED
        seq.block_table_version += 1
        seq.released_blocks = end

    def _unref(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free_queue[block] = None
            if self.prefix.block_hashes[block] is None:
                self.free_queue.move_to_end(block, last=False)

    def fork(self, parent: Sequence, child: Sequence) -> tuple[int, int] | None:
        """Give ``child`` the KV of ``parent``'s computed tokens: full blocks are shared (one
        more reference each), the partial last block gets a fresh block whose contents the
        caller must copy; returns that ``(source, destination)`` pair, or None when there is
        no partial block. With no free block for the copy, the child keeps the full blocks
        only and recomputes the few tokens of the partial one."""
        if child.block_table:
            raise RuntimeError(f"request {child.request_id}: forked while holding blocks")
        bs = self.block_size
        computed = parent.num_computed_tokens
        full = computed // bs
        shared = parent.block_table[:full]
        for block in shared:
            if block != RELEASED:
                self.ref_counts[block] += 1
        child.block_table = list(shared)
        child.block_table_version += 1
        child.released_blocks = min(parent.released_blocks, full)
        child.block_hashes = list(parent.block_hashes[:full])
        child.num_registered_blocks = min(full, parent.num_registered_blocks)
        child.num_computed_tokens = full * bs
        if computed % bs == 0 or self.num_free_blocks == 0:
            self._set_slots_ready(child)
            return None
        block = self._pop_free_block()
        child.block_table.append(block)
        child.num_computed_tokens = computed
        self._set_slots_ready(child)
        return parent.block_table[full], block

    def free(self, seq: Sequence) -> None:
        """Release a sequence's blocks, tail first so the tail is evicted before the shared head."""
        for block in reversed(seq.block_table):
            if block != RELEASED:
                self._unref(block)
        seq.block_table = []
        seq.block_table_version += 1
        seq.num_registered_blocks = 0
        seq.released_blocks = 0
        seq.slots_ready_until = 0

    def reset_prefix_cache(self) -> None:
        """Forget every published block."""
        self.prefix.reset()

    def unfilled_slots(self, seq: Sequence) -> int:
        """Token slots the sequence holds that carry no token yet (tail block, reservations)."""
        return len(seq.block_table) * self.block_size - seq.num_computed_tokens
