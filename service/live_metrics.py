"""Latency and load figures of the live routes' engine, under the names vLLM exports, so a
dashboard built for ``vllm serve`` reads ``tokenmill serve`` unchanged.

Every series is labelled by ``model_name`` only, never by key: ``/metrics`` needs no key.
Times are taken on the engine thread (``service.live_engine``): a request *arrives* when its
HTTP handler hands it over, is *scheduled* at the start of the first step that computes any of
its prompt, gets its *first token* at the end of the step that samples it, and ends at the end
of the step that finishes it. ``time_per_output_token`` is a finished request's mean gap
between tokens after the first, ``(end - first token) / (tokens - 1)``. Running and waiting
count the engine's sequences (a request with ``n`` samples counts ``n`` once forked).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from engine import RequestOutput

LABELS = ["model_name"]
_LATENCY = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
            40.0, 80.0, 160.0, 640.0, 2560.0)
_PER_TOKEN = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
              10.0, 20.0, 40.0, 80.0)

TTFT = Histogram("vllm:time_to_first_token_seconds", "Time from a request's arrival to its first token.",
                 LABELS, buckets=_LATENCY)
TPOT = Histogram("vllm:time_per_output_token_seconds", "A finished request's mean time per token after the first.",
                 LABELS, buckets=_PER_TOKEN)
E2E = Histogram("vllm:e2e_request_latency_seconds", "Time from a request's arrival to its end.", LABELS,
                buckets=_LATENCY)
QUEUE = Histogram("vllm:request_queue_time_seconds", "Time a request waited before its first step.", LABELS,
                  buckets=_LATENCY)
RUNNING = Gauge("vllm:num_requests_running", "Sequences in the live engine's running batch.", LABELS)
WAITING = Gauge("vllm:num_requests_waiting", "Sequences waiting for the live engine.", LABELS)
KV_USAGE = Gauge("vllm:kv_cache_usage_perc", "Share of the live engine's KV blocks in use (1 = all).", LABELS)
PREFIX_QUERIES = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", LABELS)
PREFIX_HITS = Counter("vllm:prefix_cache_hits", "Prompt tokens the prefix cache served.", LABELS)
PROMPT_TOKENS = Counter("vllm:prompt_tokens", "Prompt tokens of finished live requests.", LABELS)
GENERATION_TOKENS = Counter("vllm:generation_tokens", "Tokens generated for finished live requests.", LABELS)
SUCCESS = Counter("vllm:request_success", "Finished live requests, by why they finished.",
                  [*LABELS, "finished_reason"])


@dataclass
class _Times:
    arrived: float
    scheduled: float | None = None
    first_token: float | None = None


class LiveMetrics:
    """One per live engine; called on its thread only."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self._times: dict[str, _Times] = {}
        self._queries = self._hits = 0  # the scheduler's totals at the last step

    def arrived(self, request_id: str, when: float) -> None:
        self._times[request_id] = _Times(when)

    def dropped(self, request_id: str) -> None:
        """An aborted request: no latency is recorded for it."""
        self._times.pop(request_id, None)

    def start(self, engine: Any) -> None:
        """The engine is built and warmed: the gauges read from now on, and the warm-up's prompt
        is not counted as a prefix-cache query."""
        self._queries, self._hits = engine.scheduler.prefix_query_tokens, engine.scheduler.prefix_hit_tokens
        self.after_step(engine, 0.0, 0.0)

    def after_step(self, engine: Any, started: float, now: float) -> None:
        """After one step that began at ``started``: queue times and first tokens, and the gauges."""
        for request_id, times in self._times.items():
            state = engine.requests.get(request_id)
            if state is not None:
                self._progress(times, state.seqs, started, now)
        self.gauges(engine)

    def gauges(self, engine: Any) -> None:
        """Running, waiting, KV use and the prefix-cache counters, as the engine stands now."""
        scheduler, blocks = engine.scheduler, engine.block_manager
        RUNNING.labels(self.model_name).set(len(scheduler.running))
        WAITING.labels(self.model_name).set(len(scheduler.waiting))
        KV_USAGE.labels(self.model_name).set(blocks.num_used_blocks / max(1, engine.num_kv_blocks))
        queries, hits = scheduler.prefix_query_tokens, scheduler.prefix_hit_tokens
        PREFIX_QUERIES.labels(self.model_name).inc(max(0, queries - self._queries))
        PREFIX_HITS.labels(self.model_name).inc(max(0, hits - self._hits))
        self._queries, self._hits = queries, hits

    def _progress(self, times: _Times, seqs: list[Any], started: float, now: float) -> None:
        if times.scheduled is None and any(s.num_computed_tokens for s in seqs):
            times.scheduled = started
            QUEUE.labels(self.model_name).observe(started - times.arrived)
        if times.first_token is None and any(s.num_output_tokens > s.num_pending_tokens for s in seqs):
            times.first_token = now
            TTFT.labels(self.model_name).observe(now - times.arrived)

    def finished(self, out: RequestOutput, started: float, now: float) -> None:
        times = self._times.pop(out.request_id, None)
        if times is None:
            return
        if times.scheduled is None:
            times.scheduled = started
            QUEUE.labels(self.model_name).observe(started - times.arrived)
        tokens = max(len(c.token_ids) for c in out.outputs)
        if times.first_token is None and tokens:
            times.first_token = now
            TTFT.labels(self.model_name).observe(now - times.arrived)
        if tokens > 1 and times.first_token is not None:
            TPOT.labels(self.model_name).observe((now - times.first_token) / (tokens - 1))
        E2E.labels(self.model_name).observe(now - times.arrived)
        PROMPT_TOKENS.labels(self.model_name).inc(len(out.prompt_token_ids))
        GENERATION_TOKENS.labels(self.model_name).inc(sum(len(c.token_ids) for c in out.outputs))
        SUCCESS.labels(self.model_name, out.finish_reason or "stop").inc()
