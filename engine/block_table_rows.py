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

from engine.sequence import Sequence, SequenceStatus

_ROW = attrgetter("table_row")
_VERSION = attrgetter("block_table_version")
_BLOCK_TABLE = attrgetter("block_table")


class BlockTableRows:
    """Rows of block ids owned by sequences; a finished sequence's row is taken back when a
    new sequence needs one and none is free, and the table doubles when that frees few."""

    def __init__(self, max_blocks_per_seq: int, rows: int = 64) -> None:
        self.table = np.zeros((rows, max(1, max_blocks_per_seq)), np.int64)
        self.synced = np.zeros(rows, np.int64)  # entries of each row copied from its sequence's list
        self.version = np.full(rows, -1, np.int64)  # the block_table_version they were copied at
        self.owner: list[Sequence | None] = [None] * rows
        self.free: list[int] = list(range(rows - 1, -1, -1))

    def rows_for(self, seqs: list[Sequence]) -> np.ndarray:
        """Each sequence's row, brought up to date."""
        n = len(seqs)
        # attrgetter and len mapped in C: no Python frame per sequence. One array per field:
        # fromiter of (row, version) pairs into a two-column dtype took 3x as long as both.
        rows = np.fromiter(map(_ROW, seqs), np.int64, n)
        versions = np.fromiter(map(_VERSION, seqs), np.int64, n)
        lens = np.fromiter(map(len, map(_BLOCK_TABLE, seqs)), np.int64, n)
        for i in np.flatnonzero(rows < 0).tolist():
            rows[i] = self._assign(seqs[i])
        done = self.synced[rows]
        rewrite = (versions != self.version[rows]) | (lens < done)  # anything but an append
        for i in np.flatnonzero(rewrite).tolist():
            self._sync(seqs[i], int(rows[i]))
        grown = np.flatnonzero(~rewrite & (lens > done))
        if len(grown):
            self._append(seqs, grown, rows[grown], done[grown], lens[grown])
        return rows

    def gather(self, rows: np.ndarray, width: int) -> np.ndarray:
        """The step's ``[len(rows), width]`` table (a copy: later syncs do not move it)."""
        if width > self.table.shape[1]:
            self._widen(width)
        return self.table[rows, :width]

    def _sync(self, seq: Sequence, row: int) -> None:
        """The row anew, zeros after it."""
        blocks = seq.block_table
        if len(blocks) > self.table.shape[1]:
            self._widen(len(blocks))
        self.table[row, : len(blocks)] = blocks
        self.table[row, len(blocks) :] = 0
        self.synced[row] = len(blocks)
        self.version[row] = seq.block_table_version

    def _append(self, seqs: list[Sequence], which: np.ndarray, rows: np.ndarray, done: np.ndarray,
                lens: np.ndarray) -> None:
        """Copy the entries appended since the last sync, every grown row's in one assignment
        (a decode step at 1,024 sequences appends to about 64 rows)."""
        if int(lens.max()) > self.table.shape[1]:
            self._widen(int(lens.max()))
        values: list[int] = []
        for i, start in zip(which.tolist(), done.tolist(), strict=True):
            values += seqs[i].block_table[start:]
        counts = lens - done
        first = np.cumsum(counts) - counts  # where each row's new entries start in ``values``
        columns = np.arange(len(values)) - np.repeat(first - done, counts)
        self.table[np.repeat(rows, counts), columns] = values
        self.synced[rows] = lens

    def _assign(self, seq: Sequence) -> int:
        if not self.free:
            self._take_back_finished()
            # Few taken back (a full batch where a handful finish each step): grow, so the next
            # scan of every row is many steps away rather than at the next admission.
            if len(self.free) <= len(self.owner) // 8:
                self._grow()
        row = self.free.pop()
        self.owner[row] = seq
        seq.table_row = row
        self.version[row] = -1  # no sequence's version: the first sync rewrites the whole row
        return row

    def _take_back_finished(self) -> None:
        for row, owner in enumerate(self.owner):
            if owner is not None and owner.status is SequenceStatus.FINISHED:
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
