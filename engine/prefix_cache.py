"""The prefix cache: which pool blocks hold which full-block prefix, by chained hash.

Plain Python over ids and hashes (no torch). ``BlockManager`` owns the blocks and their
reference counts; this keeps only what a later request needs to find a prefix computed
before: a block's hash once it is published, and the block that serves each hash.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence as Seq

from engine.sequence import Sequence

RELEASED = -1  # a block-table entry given back because it fell out of the sliding window

_ROOT = b"\0" * 16  # the parent of a sequence's first block


def hash_block(parent: bytes | None, token_ids: Seq[int]) -> bytes:
    """Chain hash of one full block: the parent's hash and this block's tokens.

    A 128-bit BLAKE2b digest makes a collision between two different prefixes
    practically impossible, so a hit needs no token-by-token recheck.
    """
    return _chain(parent or _ROOT, array("q", token_ids).tobytes())


def _chain(parent: bytes, block: bytes) -> bytes:
    """The digest of a block given its parent's: BLAKE2b-128 of the parent hash and the block's int64 ids."""
    return hashlib.blake2b(parent + block, digest_size=16).digest()


class PrefixCache:
    """Published blocks, by hash. A block stays published while it sits in the free queue (a
    later request revives it) until the block manager hands it out again or forgets it."""

    def __init__(self, num_blocks: int, block_size: int, enabled: bool) -> None:
        self.num_blocks, self.block_size, self.enabled = num_blocks, block_size, enabled
        self.block_hashes: list[bytes | None] = [None] * num_blocks
        self.hash_to_block: dict[bytes, int] = {}

    def ensure_hashes(self, seq: Sequence, num_full_blocks: int) -> None:
        """``hash_block`` of each full block not hashed yet; the tokens become bytes in one go."""
        hashes = seq.block_hashes
        first = len(hashes)
        if first >= num_full_blocks:
            return
        bs = self.block_size
        data = array("q", seq.token_ids[first * bs : num_full_blocks * bs]).tobytes()
        width = bs * 8  # int64 ids
        parent = hashes[-1] if hashes else _ROOT
        for start in range(0, len(data), width):
            parent = _chain(parent, data[start : start + width])
            hashes.append(parent)

    def find(self, seq: Sequence) -> list[int]:
        """Block ids holding the longest cached prefix of ``seq``.

        At most ``seq.max_cached_tokens`` tokens can hit: the last token is always recomputed
        because its logits are needed to sample the next one, and so are prompt positions
        whose logprobs the request asks for.
        """
        if not self.enabled:
            return []
        max_blocks = max(0, seq.max_cached_tokens) // self.block_size
        self.ensure_hashes(seq, max_blocks)
        hits: list[int] = []
        for h in seq.block_hashes[:max_blocks]:
            block = self.hash_to_block.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def publish(self, seq: Sequence, num_tokens: int) -> None:
        """Publish the sequence's blocks that ``num_tokens`` scheduled tokens fill: a block of
        prompt tokens as soon as it is full, any other once a token past it is scheduled.

        Called when the tokens are scheduled, before the forward pass: a request admitted
        later in the same step may map these blocks, which is safe because every layer
        writes all of a step's keys and values before any attention reads them. A prompt's
        blocks are all published at admission (a prompt that ends on a block boundary too, and
        one that asks for a single token: it finishes before any later call). A block that
        decodes fill waits for the token past it, so the call that gives a decoding sequence
        its next block publishes the one before: one call per block, not two. Only blocks
        past ``seq.num_registered_blocks`` are looked at; a block holding a token not sampled
        yet (async scheduling) waits for a later call.
        """
        if not self.enabled:
            return
        scheduled = max(min(num_tokens, len(seq.prompt_token_ids)), num_tokens - 1)
        num_full = min(scheduled, len(seq.token_ids) - seq.num_pending_tokens) // self.block_size
        first = seq.num_registered_blocks
        if num_full <= first:
            return
        self.ensure_hashes(seq, num_full)
        for i in range(max(first, seq.released_blocks), num_full):
            block = seq.block_table[i]
            if block == RELEASED or self.block_hashes[block] is not None:
                continue
            h = seq.block_hashes[i]
            if h in self.hash_to_block:
                continue  # an identical block already serves this prefix
            self.block_hashes[block] = h
            self.hash_to_block[h] = block
        seq.num_registered_blocks = num_full

    def forget(self, block_ids: Seq[int]) -> None:
        """Drop the entries of blocks whose contents can no longer be trusted (or are reused)."""
        for block in block_ids:
            if block == RELEASED:
                continue
            h = self.block_hashes[block]
            if h is not None:
                self.block_hashes[block] = None
                if self.hash_to_block.get(h) == block:
                    del self.hash_to_block[h]

    def reset(self) -> None:
        """Forget every published block (``forget`` of all, without the walk)."""
        self.block_hashes = [None] * self.num_blocks
        self.hash_to_block.clear()
