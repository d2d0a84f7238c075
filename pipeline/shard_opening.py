"""A shard the driver has opened: its reader, the rows read but not yet admitted, its part.

Opening decides first whether the shard needs running at all: a part that is already
current (same input, same plan, and its JSON lines if the plan writes them) is skipped,
reading its counts and commit id from the part's footer, and
a shard that cannot be opened ends as failed, before any row is read. A shard that an
earlier attempt checkpointed goes on after its checkpoint: the rows it holds are read
(rows are positions, so they must be) but never prepared or computed again.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import pyarrow as pa

from connectors import (
    Record,
    ShardReadError,
    ShardRef,
    is_transient,
    part_is_current,
    part_lines_are_current,
    read_part_commit,
    read_records,
)
from pipeline.part_info import read_part_counts
from pipeline.part_sink import PartSink
from pipeline.plan import JobPlan
from pipeline.previous_rows import PreviousRows, load_previous_rows
from pipeline.row_preparation import PreparedRow, RowPreparation
from pipeline.shard_outcome import ShardCounts, ShardOutcome, ShardState

log = logging.getLogger(__name__)


class ReadFailure(NamedTuple):
    """Why a shard's reader failed: its part is abandoned, and retried if ``transient``."""

    reason: str
    transient: bool


@dataclass
class ShardEnd:
    """How a shard ended without being run (skipped, or failed to open)."""

    state: ShardState
    reason: str
    transient: bool = False
    counts: ShardCounts | None = None
    part_commit: str | None = None  # a skipped shard's part: its identity


@dataclass
class OpenShard:
    ref: ShardRef
    batches: Iterator[list[Record]]
    sink: PartSink
    progress: ShardOutcome  # running; its counts are the sink's
    started: float = field(default_factory=time.perf_counter)
    buffer: deque[PreparedRow] = field(default_factory=deque)  # read, not yet admitted
    exhausted: bool = False  # nothing more to read (or reading stopped)
    in_flight: set[str] = field(default_factory=set)  # its request ids in the engine
    rows_read: int = 0
    skip: int = 0  # rows still to pass over unread: the checkpoint holds them
    previous: PreviousRows | None = None  # the previous part's results by content key
    rows_reused: int = 0  # rows taken from the previous part
    rows_shared: int = 0  # rows that took the result of an identical row of this run
    output_tokens_computed: int = 0  # output tokens of its rows the engine computed in this run

    @property
    def held(self) -> int:
        """Rows read and not yet in the part's file."""
        return self.rows_read - self.sink.spooled

    def read_next(self, preparation: RowPreparation) -> ReadFailure | None:
        """Read the next batch into the buffer, in admission order; why, if reading failed."""
        try:
            batch = next(self.batches)
        except StopIteration:
            self.exhausted = True
            return None
        except ShardReadError as exc:
            return ReadFailure(str(exc), False)
        except Exception as exc:
            return ReadFailure(f"{type(exc).__name__}: {exc}", is_transient(exc))
        if self.skip:
            passed, batch = batch[: self.skip], batch[self.skip :]
            self.skip -= len(passed)
            self.rows_read += len(passed)
        self.buffer.extend(preparation.order(batch, self.rows_read))
        self.rows_read += len(batch)
        return None

    def stop_reading(self) -> None:
        self.buffer.clear()
        self.exhausted = True
        close = getattr(self.batches, "close", None)
        if close is not None:
            close()


def open_shard(plan: JobPlan, ref: ShardRef, schema: pa.Schema, batch_size: int) -> OpenShard | ShardEnd:
    """The shard opened for reading, or how it ends without running (its part is current, or it cannot be read)."""
    try:
        current = part_is_current(
            plan.output_url, ref.part_id, plan.part_fingerprint(ref.fingerprint), plan.output_options
        ) and (not plan.openai_output or part_lines_are_current(plan.output_url, ref.part_id, plan.output_options))
    except Exception as exc:  # cannot tell: run it; a real storage problem shows at write time
        log.warning("cannot check part %s of %s: %s", ref.part_id, plan.job_id, exc)
        current = False
    if current:
        counts = read_part_counts(plan.output_url, ref.part_id, plan.output_options)
        commit = read_part_commit(plan.output_url, ref.part_id, plan.output_options)
        return ShardEnd(ShardState.SKIPPED, "part already current", counts=counts, part_commit=commit)
    try:
        batches = read_records(ref, text_field=plan.text_field, id_field=plan.id_field, batch_size=batch_size,
                               storage_options=plan.storage_options)
    except ShardReadError as exc:
        return ShardEnd(ShardState.FAILED, str(exc))
    except Exception as exc:
        return ShardEnd(ShardState.FAILED, f"{type(exc).__name__}: {exc}", transient=is_transient(exc))
    sink = PartSink(plan, ref, schema)
    try:
        resume = sink.resume()
    except Exception as exc:  # the part's local file cannot be written
        sink.discard()
        close = getattr(batches, "close", None)
        if close is not None:
            close()
        return ShardEnd(ShardState.FAILED, f"cannot resume from the checkpoint: {type(exc).__name__}: {exc}",
                        transient=is_transient(exc))
    progress = ShardOutcome(ref.index, ref.url, ShardState.RUNNING, sink.counts, rows_resumed=resume)
    return OpenShard(ref, batches, sink, progress, skip=resume, previous=load_previous_rows(plan, ref))
