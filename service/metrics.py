"""The server's Prometheus metrics: batches and jobs by status, from the store's in-memory index.
No label names a key or an owner: ``/metrics`` needs no key, so it shows no per-team figure.

In embedded mode the same registry also carries the engine and shard metrics of
``pipeline.metrics``, since jobs run in this process.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pipeline.job_status import JobStatus
from service.records import BATCH_FINAL, BatchRecord, JobRecord, Store

BATCH_STATUSES = ("validating", "in_progress", "finalizing", "cancelling", *BATCH_FINAL)
JOB_STATUSES = tuple(s.value for s in JobStatus)


class RecordsCollector(Collector):
    def __init__(self, store: Store) -> None:
        self.store = store

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The families without their values: registering reads no record."""
        yield GaugeMetricFamily("tokenmill_server_batches", "", labels=["status"])
        yield GaugeMetricFamily("tokenmill_server_jobs", "", labels=["status"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        batches = self.store.status_counts(BatchRecord)  # from memory: a scrape reads no record
        jobs = self.store.status_counts(JobRecord)
        for name, doc, counts, known in (
            ("tokenmill_server_batches", "Batches known to this server, by status", batches, BATCH_STATUSES),
            ("tokenmill_server_jobs", "Jobs submitted through this server (batches included), by status",
             jobs, JOB_STATUSES),
        ):
            family = GaugeMetricFamily(name, doc, labels=["status"])
            for status in sorted(set(known) | set(counts)):
                family.add_metric([status], counts.get(status, 0))
            yield family


_installed: RecordsCollector | None = None


def install(store: Store) -> None:
    """Register (or re-point) the collector on the default registry."""
    global _installed
    if _installed is not None:
        REGISTRY.unregister(_installed)
        _installed = None
    _installed = RecordsCollector(store)
    REGISTRY.register(_installed)
