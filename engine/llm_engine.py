"""The step loop: schedule, run the model once, sample, hand the tokens back to the scheduler."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from engine.attention import get_backend
from engine.beam_requests import BeamRequest, BeamRequests
from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.device_features import announce, batch_limits, choose_features
from engine.host import tune_for_cpu
from engine.logprobs import log_softmax, position_logprobs, prompt_logprobs_for_rows
from engine.model_loader import eos_token_ids, load_config, load_model, load_tokenizer
from engine.model_registry import resolve_model
from engine.model_runner import InFlightStep, ModelRunner, StepLogits
from engine.output_processor import OutputProcessor
from engine.outputs import RequestOutput
from engine.parallel.driver import TensorParallel
from engine.pooling import accumulate
from engine.pooling_config import model_pooling
from engine.request_control import RequestControl
from engine.request_intake import RequestError, RequestIntake
from engine.request_state import RequestState
from engine.sample_forks import SampleForks
from engine.scheduled_batch import ScheduledBatch
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus
from engine.stats import EngineStats
from engine.step_faults import StepFaults
from engine.step_inputs import PLACEHOLDER
from engine.stopping import StopConditions
from engine.structured_output import StructuredOutputBackend

__all__ = ["LLMEngine", "RequestError"]

log = logging.getLogger(__name__)


class LLMEngine(RequestControl):
    """Wires the parts together: the scheduler owns the queues and each step's post-processing,
    the model runner the device, the output processor the texts; requests live in ``requests``."""

    def __init__(self, config: EngineConfig) -> None:
        self.model_dir = resolve_model(config.model, config.revision)
        device = self.device = config.resolved_device()
        limits = batch_limits(device, config.max_num_seqs, config.max_num_batched_tokens)
        config = self.config = dataclasses.replace(  # the step bounds resolved for this device
            config, max_num_seqs=limits.max_num_seqs, max_num_batched_tokens=limits.max_num_batched_tokens
        )
        if device == "cpu":
            tune_for_cpu(config.num_threads)
        hf_config = load_config(self.model_dir)
        self.max_model_len = min(
            config.max_model_len or hf_config.max_position_embeddings, hf_config.max_position_embeddings
        )
        self.parallel = None  # the worker ranks, with tensor_parallel_size > 1
        if config.tensor_parallel_size > 1:
            self.parallel = TensorParallel(config, self.model_dir, self.max_model_len, device)
            self.runner = self.parallel.runner
            model = self.runner.model
        else:
            model = load_model(self.model_dir, config.torch_dtype, device, self.max_model_len, config.quantization)
            features = choose_features(device, config.attention_backend, config.enforce_eager, config.num_kv_blocks,
                                       config.compile, model.head_dim)
            announce(features)
            backend = get_backend(features.attention_backend, device)
            self.runner = ModelRunner(model, backend, config, self.max_model_len, device, features)
        self.quantization = getattr(model, "quantization", "none")  # what runs: "none", or the quantized format
        self.tokenizer = load_tokenizer(self.model_dir)
        self.eos_token_ids = eos_token_ids(self.model_dir, self.tokenizer)
        self.num_kv_blocks = self.runner.num_kv_blocks
        self.block_manager = BlockManager(
            self.num_kv_blocks, config.block_size, config.enable_prefix_caching, config.kv_allocation,
            window=getattr(model, "kv_window", None),
        )
        self.output_processor = OutputProcessor(self.tokenizer)
        stop = StopConditions(frozenset(self.eos_token_ids), self.max_model_len, self.output_processor.find_stop_string)
        self.scheduler = Scheduler(
            self.block_manager, config.max_num_seqs, config.max_num_batched_tokens, config.scheduling, stop
        )
        self.step_faults = StepFaults(self._run, self.scheduler, self.block_manager, self._fail)
        self.stats_tracker = EngineStats(self.num_kv_blocks, config.block_size)
        self.structured = StructuredOutputBackend(self.tokenizer, hf_config.vocab_size, sorted(self.eos_token_ids))
        self.intake = RequestIntake(
            hf_config.vocab_size, self.max_model_len, self.num_kv_blocks, config.block_size, self.structured,
            config.seed, hf_config.hidden_size, model_pooling(self.model_dir),
        )
        self.requests: dict[str, RequestState] = {}
        self._fork = SampleForks(self.scheduler, self.intake, self.stats_tracker, self.runner.copy_blocks, self.requests)
        self.beams = BeamRequests(self.scheduler, self.intake, frozenset(self.eos_token_ids), self.runner.copy_blocks,
                                  self.stats_tracker.on_fork)
        self.async_scheduling = config.async_scheduling if config.async_scheduling is not None else device != "cpu"
        self._in_flight: InFlightStep | None = None  # the launched step whose tokens are not back yet
        # requests whose steps need the host per token (grammar, logprobs, forks); while there are
        # none, a step is overlappable without looking at its sequences (a stale id only costs that)
        self._host_bound: set[str] = set()
        # Test hook: called with the sequences of every forward pass; raising simulates a fault.
        self.fault_injector = None
        self.feed_failure: Exception | None = None  # what stopped feed_requests' feed, for its caller

    # ---- the step -------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One scheduler step and one forward pass; returns the requests it finished."""
        if self.async_scheduling:
            return self._step_overlapped()
        batch = self._schedule()
        self.stats_tracker.on_schedule(batch, self.scheduler)
        finished: list[RequestOutput] = []
        if batch:
            self._run_now(batch, finished)
        return finished

    def _run_now(self, batch: ScheduledBatch, finished: list[RequestOutput]) -> None:
        """Run a scheduled step to the end: forward pass, prompt logprobs, forks, sampling, update."""
        step = self.step_faults.execute(batch, finished)
        self.stats_tracker.on_computed(self.scheduler, self.block_manager)
        for seq, first, rows in step.prompt:
            k = seq.params.prompt_logprobs or 0
            entries = prompt_logprobs_for_rows(rows, seq.prompt_token_ids, first, k)
            self.requests[seq.request_id].prompt_logprobs[first + 1 : first + 1 + len(entries)] = entries
        for seq, first, rows in step.pooled:
            if (vector := accumulate(seq, first, rows)) is not None:
                self._finish_embedding(seq, vector, finished)
        if not step.sample_seqs:
            return
        seqs, logits = step.sample_seqs, step.logits
        if self._host_bound:  # no request forks while the set is empty
            seqs, logits = self._fork(seqs, logits)
            if self.beams.requests:
                before = len(seqs)
                seqs, logits, ended = self.beams.step(seqs, logits)
                self.stats_tracker.decode_tokens += before - len(seqs)
                for request in ended:
                    self._end_beam_search(request, finished)
                if not seqs:
                    return
        self._apply(dict(zip(seqs, self._sample(seqs, logits), strict=True)), finished)

    def _apply(self, sampled: dict[Sequence, int], finished: list[RequestOutput]) -> None:
        """Hand a step's tokens to the scheduler; collect the requests that are now complete."""
        self.stats_tracker.decode_tokens += len(sampled)
        for seq in self.scheduler.update(sampled):
            state = self.requests[seq.request_id]
            state.num_finished += 1
            if state.finished:
                finished.append(self.output_processor.build(state))
                del self.requests[seq.request_id]
                self._host_bound.discard(seq.request_id)

    def _finish_embedding(self, seq: Sequence, vector, finished: list[RequestOutput]) -> None:
        """An embedding is complete: its request ends in this step and its blocks are free now."""
        self.scheduler.finish(seq, "stop")
        state = self.requests.pop(seq.request_id)
        state.embedding, state.num_finished = vector, 1
        finished.append(self.output_processor.build(state))

    def _end_beam_search(self, request: BeamRequest, finished: list[RequestOutput]) -> None:
        rid = request.state.request_id
        metrics = request.metrics(self.scheduler.step_count)
        finished.append(self.output_processor.build_beams(request.state, request.group.finished, metrics))
        del self.requests[rid]
        self._host_bound.discard(rid)

    def _schedule(self) -> ScheduledBatch:
        """The scheduler's next step; if it finds nothing to run while beams that wait for their
        siblings hold blocks, they give them up and it schedules again (``BeamRequests.park_idle``)."""
        batch = self.scheduler.schedule()
        if not batch and self._in_flight is None and self.beams.requests and self.beams.park_idle():
            batch = self.scheduler.schedule()
        return batch

    # ---- async scheduling -----------------------------------------------------------
    def _step_overlapped(self) -> list[RequestOutput]:
        """Schedule step t+1 and launch it while step t is still on the device.

        Sequences that sampled in step t carry a placeholder as their last token; the scheduler
        gives each its next position and the runner fills the placeholder from step t's tokens on
        the device. Only then does the host wait for step t's tokens and apply them, so stop
        conditions see real tokens: a sequence that stops at t has one wasted position in t+1,
        whose token is dropped. A step that needs host state per token (grammars, logprobs,
        prompt logprobs, forks) or a fault hook runs synchronously after step t is applied."""
        finished: list[RequestOutput] = []
        batch = self._schedule()
        self.stats_tracker.on_schedule(batch, self.scheduler)
        previous, self._in_flight = self._in_flight, None
        launched = None
        if batch and self._overlappable(batch):
            launched = self.runner.launch(batch, previous)
            self.stats_tracker.on_computed(self.scheduler, self.block_manager)
        if previous is not None:
            self._collect(previous, finished)
        if launched is not None:
            done = SequenceStatus.FINISHED  # (not the is_finished property: a thousand calls a step)
            for seq in launched.sample_seqs:
                if seq.status is not done:
                    seq.token_ids.append(PLACEHOLDER)
                    seq.num_pending_tokens = 1
            self._in_flight = launched
        elif batch:
            batch.keep([not seq.is_finished for seq in batch.seqs])  # stopped at step t
            if batch:
                self._run_now(batch, finished)
        return finished

    def _overlappable(self, batch: ScheduledBatch) -> bool:
        if self.fault_injector is not None or batch.wants_prompt_logits or batch.wants_hidden:
            return False
        return not self._host_bound or all(
            seq.matcher is None and seq.logprobs is None and not seq.pending_forks
            and seq.request_id not in self.beams.requests for seq in batch.seqs
        )

    def _collect(self, step: InFlightStep, finished: list[RequestOutput]) -> None:
        """Wait for a launched step's tokens and apply those of sequences still running."""
        tokens = step.wait()
        done = SequenceStatus.FINISHED
        self._apply({s: t for s, t in zip(step.sample_seqs, tokens, strict=True) if s.status is not done}, finished)

    def drain(self) -> list[RequestOutput]:
        """Apply the step in flight, if any (async scheduling); returns what it finished."""
        finished: list[RequestOutput] = []
        previous, self._in_flight = self._in_flight, None
        if previous is not None:
            self._collect(previous, finished)
        return finished

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
        """Next tokens under each sequence's grammar and settings; records the logprobs asked for.

        Everything happens where the logits are: grammar bitmasks, log-softmax, sampling; from a
        GPU only token ids and the logprob entries come back, never ``[rows, vocab]``."""
        if not self._host_bound:  # no grammar and no logprobs: no per-sequence look
            return self.runner.sample_tokens(logits, seqs).tolist()
        logits = self.structured.apply_masks(logits, [s.matcher for s in seqs])
        lp_rows = [i for i, s in enumerate(seqs) if s.logprobs is not None]
        raw = log_softmax(logits[lp_rows]) if lp_rows else None  # grammar-masked, before temperature/top-k/top-p
        tokens = self.runner.sample_tokens(logits, seqs).tolist()
        if raw is not None:
            picked = [tokens[i] for i in lp_rows]
            entries = position_logprobs(raw, picked, [seqs[i].params.logprobs for i in lp_rows])
            for i, token, entry in zip(lp_rows, picked, entries, strict=True):
                seqs[i].logprobs.append(entry)
                seqs[i].cumulative_logprob += entry[token].logprob
        return tokens

    def _run(self, batch: ScheduledBatch) -> StepLogits:
        if self.fault_injector is not None:
            self.fault_injector(batch.seqs)
        return self.runner.execute(batch)

    def _fail(self, seq: Sequence, error: Exception, finished: list[RequestOutput]) -> None:
        """Fail the whole request (all its samples) with the error."""
        state = self.requests.pop(seq.request_id)
        self._host_bound.discard(seq.request_id)
        self.beams.discard(seq.request_id)
        state.error = f"request {seq.request_id}: engine step failed: {type(error).__name__}: {error}"
        for s in state.seqs:
            if not s.is_finished:
                self.scheduler.abort(s, "error")
        finished.append(self.output_processor.build(state))

    def close(self, keep_ranks: bool = False) -> None:
        """Let go of the engine's processes: the worker ranks of a tensor-parallel engine exit, or
        with ``keep_ranks`` wait for the next engine of their size (a no-op for one process).
        The engine takes no steps after this."""
        if self.parallel is not None:
            self.parallel.close(keep_ranks)

    def stats(self) -> dict[str, Any]:
        out = self.stats_tracker.as_dict(self.scheduler, self.block_manager)
        out["structured_output_grammars_compiled"] = self.structured.num_compiled
        return out
