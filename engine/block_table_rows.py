"""The model runner's persistent block tables: one numpy row per live sequence, kept in step.

Rebuilding a step's ``[sequences, blocks]`` table from every sequence's Python list walks every
block id of the batch each step (about 1 ms at 1,024 sequences of 32 blocks). Here a sequence
keeps its row between steps; a step copies only the entries appended since the last one
(a decode adds a block every ``block_size`` tokens) and gathers the batch's rows in one numpy
index. The block manager bumps ``Sequence.block_table_version`` whenever it does anything to a
table other than append (admit, fork, free, a sliding-window release); such a row is copied
again in full. Entries past a row's length are 0, as a rebuilt table's padding was.
"""

from __future__ import annotations

from operator import attrgetter

import numpy as np

from engine.sequence import Sequence

_ROW_AND_VERSION = attrgetter("table_row", "block_table_version")
_BLOCK_TABLE = attrgetter("block_table")


class BlockTableRows:
    """Rows of block ids owned by sequences; a finished sequence's row is taken back when a
    new sequence needs one and none is free, and the table doubles when all are in use."""

    def __init__(self, max_blocks_per_seq: int, rows: int = 64) -> None:
        self.table = np.zeros((rows, max(1, max_blocks_per_seq)), np.int64)
        self.synced = np.zeros(rows, np.int64)  # entries of each row copied from its sequence's list
        self.version = np.full(rows, -1, np.int64)  # the block_table_version they were copied at
        self.owner: list[Sequence | None] = [None] * rows
        self.free: list[int] = list(range(rows - 1, -1, -1))

    def rows_for(self, seqs: list[Sequence]) -> np.ndarray:
        """Each sequence's row, brought up to date."""
        n = len(seqs)
        # attrgetter and len mapped in C: no Python frame per sequence
        state = np.fromiter(map(_ROW_AND_VERSION, seqs), np.dtype((np.int64, 2)), n)
        lens = np.fromiter(map(len, map(_BLOCK_TABLE, seqs)), np.int64, n)
        rows, versions = state[:, 0].copy(), state[:, 1]
        for i in np.flatnonzero(rows < 0).tolist():
            rows[i] = self._assign(seqs[i])
        rewrite = versions != self.version[rows]
        for i in np.flatnonzero(rewrite | (lens != self.synced[rows])).tolist():
            self._sync(seqs[i], int(rows[i]), bool(rewrite[i]))
        return rows

    def gather(self, rows: np.ndarray, width: int) -> np.ndarray:
        """The step's ``[len(rows), width]`` table (a copy: later syncs do not move it)."""
        if width > self.table.shape[1]:
            self._widen(width)
        return self.table[rows, :width]

    def _sync(self, seq: Sequence, row: int, rewrite: bool) -> None:
        blocks, done = seq.block_table, int(self.synced[row])
        if len(blocks) > self.table.shape[1]:
            self._widen(len(blocks))
        if rewrite or len(blocks) < done:  # anything but an append: the row anew, zeros after it
            self.table[row, len(blocks) :] = 0
            done = 0
        self.table[row, done : len(blocks)] = blocks[done:]
        self.synced[row] = len(blocks)
        self.version[row] = seq.block_table_version

    def _assign(self, seq: Sequence) -> int:
        if not self.free:
            self._take_back_finished()
        if not self.free:
            self._grow()
        row = self.free.pop()
        self.owner[row] = seq
        seq.table_row = row
        self.version[row] = -1  # no sequence's version: the first sync rewrites the whole row
        return row

    def _take_back_finished(self) -> None:
        for row, owner in enumerate(self.owner):
            if owner is not None and owner.is_finished:
                owner.table_row = -1
                self.owner[row] = None
                self.free.append(row)

    def _grow(self) -> None:
        old = len(self.owner)
        self.table = np.concatenate([self.table, np.zeros_like(self.table)])
        self.synced = np.concatenate([self.synced, np.zeros(old, np.int64)])
        self.version = np.concatenate([self.version, np.full(old, -1, np.int64)])
        self.owner.extend([None] * old)
        self.free.extend(range(2 * old - 1, old - 1, -1))

    def _widen(self, width: int) -> None:
        wider = np.zeros((len(self.owner), max(width, 2 * self.table.shape[1])), np.int64)
        wider[:, : self.table.shape[1]] = self.table
        self.table = wider
