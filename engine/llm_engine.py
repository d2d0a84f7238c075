"""The engine: its parts wired together, and the step loop (schedule -> run -> update)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from engine.attention import get_backend
from engine.beam_requests import BeamRequests
from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.device_features import announce, batch_limits, choose_features
from engine.host import tune_for_cpu
from engine.model_loader import eos_token_ids, load_config, load_model, load_tokenizer
from engine.model_registry import resolve_model
from engine.model_runner import InFlightStep, ModelRunner
from engine.output_processor import OutputProcessor
from engine.outputs import RequestOutput
from engine.parallel.driver import TensorParallel
from engine.pooling_config import model_pooling
from engine.request_control import RequestControl
from engine.request_intake import RequestError, RequestIntake
from engine.request_state import RequestState
from engine.sample_forks import SampleForks
from engine.scheduled_batch import ScheduledBatch
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.stats import EngineStats
from engine.step_runs import StepRuns
from engine.step_sampling import StepSampler
from engine.step_update import StepUpdate
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
        self.stats_tracker = EngineStats(self.num_kv_blocks, config.block_size)
        self.structured = StructuredOutputBackend(self.tokenizer, hf_config.vocab_size, sorted(self.eos_token_ids))
        self.intake = RequestIntake(
            hf_config.vocab_size, self.max_model_len, self.num_kv_blocks, config.block_size, self.structured,
            config.seed, hf_config.hidden_size, model_pooling(self.model_dir),
        )
        self.requests: dict[str, RequestState] = {}
        # requests whose steps need the host per token (grammar, logprobs, forks, beams)
        self._host_bound: set[str] = set()
        self.beams = BeamRequests(self.scheduler, self.intake, frozenset(self.eos_token_ids), self.runner.copy_blocks,
                                  self.stats_tracker.on_fork)
        forks = SampleForks(self.scheduler, self.intake, self.stats_tracker, self.runner.copy_blocks, self.requests)
        self.sampler = StepSampler(self.runner, self.structured, forks, self.beams, self.stats_tracker,
                                   self._host_bound)
        self.update = StepUpdate(self.scheduler, self.sampler, self.output_processor, self.requests, self.beams,
                                 self.stats_tracker, self._host_bound)
        overlapped = config.async_scheduling if config.async_scheduling is not None else device != "cpu"
        self.runs = StepRuns(self.runner, self.scheduler, self.block_manager, self.stats_tracker, overlapped,
                             self._host_bound, self.beams, self.update.fail)
        self.source_failure: Exception | None = None  # what stopped add_requests' source, for its caller

    # ---- the step: schedule -> run -> update -----------------------------------------
    def step(self) -> list[RequestOutput]:
        """One step; returns the requests it finished. The scheduler picks this step's tokens,
        ``StepRuns`` runs the forward pass (with async scheduling: launches it while the step
        before is still on the device, and hands back that one's tokens first), and
        ``StepUpdate`` samples and hands the tokens back to the scheduler."""
        finished: list[RequestOutput] = []
        batch = self.schedule()
        for ran in self.runs.run(batch, finished):
            self.update(ran, finished)
        return finished

    def schedule(self) -> ScheduledBatch:
        """The scheduler's next step; if it finds nothing to run while beams that wait for their
        siblings hold blocks, they give them up and it schedules again (``BeamRequests.park_idle``)."""
        batch = self.scheduler.schedule()
        if not batch and self.runs.in_flight is None and self.beams.requests and self.beams.park_idle():
            batch = self.scheduler.schedule()
        self.stats_tracker.on_schedule(batch, self.scheduler)
        return batch

    def drain(self) -> list[RequestOutput]:
        """Apply the step in flight, if any (async scheduling); returns what it finished."""
        finished: list[RequestOutput] = []
        previous = self.runs.take_in_flight()
        if previous is not None:
            self.update(previous, finished)
        return finished

    @property
    def async_scheduling(self) -> bool:
        return self.runs.overlapped

    @property
    def _in_flight(self) -> InFlightStep | None:
        return self.runs.in_flight

    @property
    def fault_injector(self) -> Callable[[list[Sequence]], None] | None:
        """Test hook: called with the sequences of every forward pass; raising simulates a fault."""
        return self.runs.fault_injector

    @fault_injector.setter
    def fault_injector(self, hook: Callable[[list[Sequence]], None] | None) -> None:
        self.runs.fault_injector = hook

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
