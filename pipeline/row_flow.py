"""A row's way through a shard driver's engine, as one object: prepared into requests, tracked
while they run, shared with identical rows, and shaped into its result row."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from pipeline.in_flight import InFlight, InFlightRequests
from pipeline.output_schema import output_schema
from pipeline.plan import JobPlan
from pipeline.result_row import RequestResult, ResultRow
from pipeline.result_rows import ResultRows
from pipeline.row_preparation import PreparedRow, RowPreparation
from pipeline.row_requests import RequestBuilder
from pipeline.row_sharing import RowSharing
from pipeline.shard_engine import ShardEngine
from pipeline.shard_opening import OpenShard

log = logging.getLogger(__name__)

Complete = Callable[[OpenShard, PreparedRow, ResultRow], None]  # a finished row to its shard's part


class FinishedRow(NamedTuple):
    """A finished row's result from the kind, its result row, and when it was built."""

    result: RequestResult
    row: ResultRow
    at: float


@dataclass
class RowFlow:
    plan: JobPlan
    schema: Any  # the part's Arrow schema (pipeline.output_schema)
    in_flight: InFlightRequests  # the rows' requests in the engine
    results: ResultRows  # fixed columns, the kind's row step, the OpenAI line
    sharing: RowSharing  # rows that take the result of an earlier or identical row
    engine: ShardEngine
    builder: RequestBuilder  # a row's requests, and its outputs back to values (the kind's)
    preparation: RowPreparation  # records to ordered, tokenized rows

    @classmethod
    def build(cls, plan: JobPlan, engine: ShardEngine, complete: Complete) -> RowFlow:
        """The flow of ``plan``'s rows through ``engine``; ``complete`` takes each finished row."""
        schema = output_schema(plan)
        in_flight = InFlightRequests(engine, uuid.uuid4().hex[:8])
        results = ResultRows(plan, schema)
        sharing = RowSharing(plan, in_flight, results, complete)
        builder = RequestBuilder(plan, engine)
        return cls(plan, schema, in_flight, results, sharing, engine, builder,
                   RowPreparation(plan, engine, builder))

    def use_engine(self, engine: ShardEngine | None) -> None:
        """Rebuild what is bound to the engine (None: let go of the old one first)."""
        self.engine = engine  # type: ignore[assignment]
        self.in_flight.use_engine(engine)  # type: ignore[arg-type]
        if engine is None:
            self.builder = self.preparation = None  # type: ignore[assignment]
            return
        self.builder = RequestBuilder(self.plan, engine)
        self.preparation = RowPreparation(self.plan, engine, self.builder)

    def result_row(self, inf: InFlight) -> FinishedRow:
        """A finished row's values from the kind (its error if that fails: it costs the row
        only), its result row, and when it was built."""
        record = inf.row.record
        try:
            result = self.builder.row_values(inf.group)
        except Exception as exc:
            log.exception("cannot build the result of row %d", record.row_number)
            result = RequestResult(error=f"row {record.row_number}: {type(exc).__name__}: {exc}")
        now = time.perf_counter()
        return FinishedRow(result, self.results.build(record, result, latency_s=now - inf.admitted_at,
                                                      content_key=inf.row.key), now)

    def drop_all_as_errors(self, message: str) -> list[tuple[InFlight, ResultRow]]:
        """Every row in the engine, dropped, with its error row (the engine is left empty)."""
        rows = []
        for inf in self.in_flight.drop_all():
            record = inf.row.record
            rows.append((inf, self.results.build(record, RequestResult(error=f"row {record.row_number}: {message}"),
                                                 latency_s=time.perf_counter() - inf.admitted_at)))
        return rows
