"""What a caller does with an engine's requests: add them (now, or fed as admission reaches
them), abort or fail them, and ask whether any is left. ``LLMEngine`` takes these methods from
here; its step loop stays in ``engine/llm_engine.py``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from engine.beam_requests import BeamRequests
from engine.block_manager import BlockManager
from engine.chat import chat_token_ids
from engine.pooling_params import PoolingParams
from engine.request_intake import RequestError, RequestIntake, sampling_params
from engine.request_source import Request, RequestSource
from engine.request_state import RequestState
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.step_runs import StepRuns

log = logging.getLogger(__name__)


class RequestControl:
    """The request side of ``LLMEngine`` (which sets these attributes)."""

    model_dir: Path
    tokenizer: Any
    requests: dict[str, RequestState]
    intake: RequestIntake
    scheduler: Scheduler
    block_manager: BlockManager
    beams: BeamRequests
    _host_bound: set[str]
    runs: StepRuns
    source_failure: Exception | None

    def encode(self, text: str) -> list[int]:
        """A text prompt's ids as HF and vLLM tokenize one: with the tokenizer's special tokens
        (Gemma's <bos>, without which it degenerates; SmolLM2 adds none)."""
        if self.tokenizer is None:
            raise RequestError(None, f"model at {self.model_dir} has no tokenizer: pass token ids")
        return self.tokenizer.encode(text, add_special_tokens=True)

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a chat rendered with the model's template, ready for generation."""
        if self.tokenizer is None:
            raise ValueError(f"model at {self.model_dir} has no tokenizer")
        return chat_token_ids(self.tokenizer, messages)  # message content never becomes control tokens

    def add_request(
        self, request_id: str, prompt: str | list[int],
        params: SamplingParams | PoolingParams | dict[str, Any] | None = None, priority: int = 0,
    ) -> None:
        """Queue a request (``PoolingParams``: an embedding request, whose output carries
        ``embedding``). Raises ``RequestError`` naming the request if it cannot run. A lower
        ``priority`` is admitted first and preempted last (``engine/scheduler.py``)."""
        if request_id in self.requests:
            raise RequestError(request_id, "id already in use")
        token_ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if isinstance(params, PoolingParams):
            state = self.intake.new_embedding(request_id, token_ids, params)
            state.priority = state.seqs[0].priority = priority
            self.requests[request_id] = state
            self.scheduler.add(state.seqs[0])
            return
        params = sampling_params(request_id, params)
        state = self.intake.new_request(request_id, token_ids, params)
        state.priority = state.seqs[0].priority = priority
        self.requests[request_id] = state
        if params.structured_output is not None or params.logprobs is not None or params.n > 1 or params.beam_width:
            self._host_bound.add(request_id)
        if params.beam_width is not None:
            self.beams.add(state)
        self.scheduler.add(state.seqs[0])

    def add_requests(
        self, requests: Iterable[Request], refused: Callable[[str, str | list[int], RequestError], None]
    ) -> None:
        """Queue ``(request_id, prompt, params)`` requests as the scheduler's admission reaches
        them rather than all now: a step is launched once its own requests are in, and in an
        overlapped engine the others are added while the device runs (``add_request`` checks,
        and tokenizes a text prompt). Admission, ids and outputs are those of adding them all
        first. A request ``add_request`` refuses goes to ``refused``; another exception stops the
        source and is kept in ``source_failure`` for the caller (``engine/request_source.py``). The
        static policy sizes a cohort from the whole queue, so there all are added now."""
        self.source_failure = None
        source = RequestSource(list(requests), self.add_request, refused, self._end_source)
        if not source.requests:
            return
        if self.scheduler.policy == "static":
            while source():
                pass
        else:
            self.scheduler.source = source

    def _end_source(self, failure: Exception | None) -> None:
        """A ``RequestSource`` ran out of requests, or broke with ``failure``."""
        self.stop_source()
        if failure is not None:
            self.source_failure = failure

    def stop_source(self) -> None:
        """Queue no more of ``add_requests``' requests (those queued already stay)."""
        self.scheduler.source = None

    def abort_request(self, request_id: str) -> None:
        state = self.requests.pop(request_id, None)
        self._host_bound.discard(request_id)
        self.beams.discard(request_id)
        if state is not None:
            for seq in state.seqs:
                if not seq.is_finished:
                    self.scheduler.abort(seq)

    def fail_requests(self, request_ids: Iterable[str]) -> None:
        """A caller failed midway: queue no more of its source and drop its requests, forgetting the
        prefix blocks they published (an exception inside a schedule leaves blocks published
        for tokens no step computed)."""
        self.stop_source()
        for request_id in request_ids:
            state = self.requests.get(request_id)
            if state is not None:
                self.block_manager.forget_sequences(state.seqs)
                self.abort_request(request_id)
        self._drop_in_flight_if_aborted()

    def abort_all(self) -> list[str]:
        """Abort every request the engine holds (finished or not), and those not fed to it yet;
        returns the ids of the ones it held."""
        self.stop_source()
        ids = list(self.requests)
        for request_id in ids:
            self.abort_request(request_id)
        self._drop_in_flight_if_aborted()
        return ids

    def _drop_in_flight_if_aborted(self) -> None:
        """Forget a launched step whose every sequence was aborted, once the device is done with
        it, so the next caller does not wait on it (or meet the error that ended the last one)."""
        step = self.runs.in_flight
        if step is None or any(not seq.is_finished for seq in step.sample_seqs):
            return
        self.runs.take_in_flight()
        try:
            step.wait()  # its writes land before its blocks serve anyone else
        except Exception as exc:  # the device may be what failed; whoever aborted has its own error
            log.warning("dropped the step in flight after its requests were aborted: %s", exc)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self.runs.in_flight is not None
