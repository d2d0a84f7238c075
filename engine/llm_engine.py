"""The step loop: schedule, run the model once, sample, retire finished requests."""

from __future__ import annotations

import functools
import itertools
import random
from typing import Any

import torch

from engine.attention import get_backend
from engine.block_manager import BlockManager
from engine.chat import chat_token_ids
from engine.config import EngineConfig
from engine.cuda_graphs import DecodeGraphs
from engine.cuda_profile import profile_cuda_blocks
from engine.detokenizer import StopStringMatcher
from engine.device_features import announce, choose_features
from engine.host import tune_for_cpu
from engine.kv_cache import allocate_kv_pool, blocks_from_budget, bytes_per_block
from engine.logprobs import log_softmax, position_logprobs, prompt_logprobs_for_rows
from engine.model_loader import eos_token_ids, load_config, load_model, load_tokenizer
from engine.model_registry import resolve_model
from engine.model_runner import ModelRunner, StepLogits
from engine.outputs import RequestOutput
from engine.request_state import RequestState, build_output
from engine.sampler import make_generator, sample
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.stats import EngineStats
from engine.stopping import finish_reason
from engine.structured_output import StructuredOutputBackend


class RequestError(ValueError):
    """A single request is invalid; other requests are unaffected. ``request_id`` names it
    (None where no request exists yet) and ``reason`` says why, without the id."""

    def __init__(self, request_id: str | None, reason: str) -> None:
        super().__init__(reason if request_id is None else f"request {request_id}: {reason}")
        self.request_id = request_id
        self.reason = reason


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_dir = resolve_model(config.model)
        device = config.resolved_device()
        self.device = device
        if device == "cpu":
            tune_for_cpu(config.num_threads)
        hf_config = load_config(self.model_dir)
        self.max_model_len = min(
            config.max_model_len or hf_config.max_position_embeddings, hf_config.max_position_embeddings
        )
        self.model = load_model(self.model_dir, config.torch_dtype, device, self.max_model_len)
        if config.compile:
            self.model = torch.compile(self.model, dynamic=True)
        self.tokenizer = load_tokenizer(self.model_dir)
        self.stop_matcher = StopStringMatcher(self.tokenizer) if self.tokenizer is not None else None
        self.eos_token_ids = eos_token_ids(self.model_dir, self.tokenizer)
        features = choose_features(device, config.attention_backend, config.enforce_eager, config.num_kv_blocks)
        announce(features)
        backend = get_backend(features.attention_backend, device)
        m = self.model if not config.compile else self.model._orig_mod
        kv_dtype = backend.kv_cache_dtype(config.torch_dtype)
        per_block = bytes_per_block(
            hf_config.num_hidden_layers, config.block_size, hf_config.num_key_value_heads, m.head_dim, kv_dtype
        )
        num_blocks = config.num_kv_blocks
        if num_blocks is None:
            if device.startswith("cuda"):
                num_blocks = profile_cuda_blocks(m, backend, config, self.max_model_len, device, kv_dtype, per_block)
            else:
                num_blocks = blocks_from_budget(config.kv_cache_memory_gb * 2**30, per_block)
        self.num_kv_blocks = num_blocks
        kv_pool = allocate_kv_pool(
            hf_config.num_hidden_layers,
            backend.kv_cache_shape(num_blocks, config.block_size, hf_config.num_key_value_heads, m.head_dim),
            kv_dtype, device,
        )
        self.runner = ModelRunner(m, backend, kv_pool, config.block_size, device)
        if config.compile:
            self.runner.model = self.model
        if features.cuda_graphs:
            self.runner.decode_graphs = DecodeGraphs(
                m, config.block_size, self.max_model_len, config.max_num_seqs, device
            )
        self.block_manager = BlockManager(
            num_blocks, config.block_size, config.enable_prefix_caching, config.kv_allocation
        )
        self.scheduler = Scheduler(
            self.block_manager, config.max_num_seqs, config.max_num_batched_tokens, config.scheduling
        )
        self.stats_tracker = EngineStats(num_blocks, config.block_size)
        self.requests: dict[str, RequestState] = {}
        self.structured = StructuredOutputBackend(self.tokenizer, hf_config.vocab_size, sorted(self.eos_token_ids))
        self._decode_token = functools.lru_cache(maxsize=1 << 16)(lambda t: self.tokenizer.decode([t]))
        self._arrival = itertools.count()
        self._rng = random.Random(config.seed)
        # Test hook: called with the sequences of every forward pass; raising simulates a fault.
        self.fault_injector = None

    def _build_output(self, state: RequestState) -> RequestOutput:
        if self.tokenizer is None:
            return build_output(state, None, None)
        return build_output(
            state, lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True), self._decode_token
        )

    # ---- requests -------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise RequestError(None, f"model at {self.model_dir} has no tokenizer: pass token ids")
        return self.tokenizer.encode(text, add_special_tokens=False)

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a chat rendered with the model's template, ready for generation."""
        if self.tokenizer is None:
            raise ValueError(f"model at {self.model_dir} has no tokenizer")
        return chat_token_ids(self.tokenizer, messages)  # message content never becomes control tokens

    def add_request(
        self, request_id: str, prompt: str | list[int], params: SamplingParams | dict[str, Any] | None = None
    ) -> None:
        """Queue a request. Raises ``RequestError`` naming the request if it cannot run."""
        if request_id in self.requests:
            raise RequestError(request_id, "id already in use")
        try:
            if params is None:
                params = SamplingParams()
            elif isinstance(params, dict):
                params = SamplingParams.from_dict(params)
            else:
                params.validate()
        except (TypeError, ValueError) as e:
            raise RequestError(request_id, f"invalid sampling parameters: {e}") from None
        if isinstance(prompt, str):
            token_ids = self.encode(prompt)
        else:
            token_ids = list(prompt)
        if not token_ids:
            raise RequestError(request_id, "empty prompt")
        vocab = self.model.config.vocab_size
        if any((not isinstance(t, int)) or t < 0 or t >= vocab for t in token_ids):
            raise RequestError(request_id, f"prompt has token ids outside the vocabulary [0, {vocab})")
        if len(token_ids) >= self.max_model_len:
            raise RequestError(
                request_id, f"prompt is {len(token_ids)} tokens, the model's context is {self.max_model_len} tokens"
            )
        max_total = min(len(token_ids) + params.max_tokens, self.max_model_len)
        needed = self.block_manager.blocks_for_tokens(max_total)
        if needed > self.num_kv_blocks:
            raise RequestError(
                request_id,
                f"needs {needed} KV blocks ({max_total} tokens) but the cache has {self.num_kv_blocks} "
                "blocks in all; it can never run",
            )
        if params.structured_output is not None:
            try:
                self.structured.compile(params.structured_output)
            except ValueError as e:
                raise RequestError(request_id, str(e)) from None
        state = RequestState(request_id, token_ids, params)
        if params.prompt_logprobs is not None:
            state.prompt_logprobs = [None] * len(token_ids)
        seq = self._new_sequence(state, 0, next(self._arrival))
        seq.pending_forks = params.n - 1
        self.requests[request_id] = state
        self.scheduler.add(seq)

    def _new_sequence(self, state: RequestState, index: int, arrival: int) -> Sequence:
        """Sample ``index`` of a request: its own RNG stream (``seed + index``) and grammar state."""
        params = state.params
        seq = Sequence(state.request_id, state.prompt_token_ids, params, arrival=arrival, sample_index=index)
        seq.max_total_tokens = min(seq.num_prompt_tokens + params.max_tokens, self.max_model_len)
        if not params.greedy:
            seed = params.seed + index if params.seed is not None else self._rng.getrandbits(63)
            seq.generator = make_generator(seed)
        if params.structured_output is not None:
            seq.matcher = self.structured.matcher(params.structured_output)
        if params.logprobs is not None:
            seq.logprobs = []
        state.seqs.append(seq)
        return seq

    def abort_request(self, request_id: str) -> None:
        state = self.requests.pop(request_id, None)
        if state is not None:
            for seq in state.seqs:
                self._forget_text(seq)
                if not seq.is_finished:
                    self.scheduler.abort(seq)

    def abort_all(self) -> list[str]:
        """Abort every request the engine holds (finished or not); returns their ids."""
        ids = list(self.requests)
        for request_id in ids:
            self.abort_request(request_id)
        return ids

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the step -------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One scheduler step and one forward pass; returns the requests it finished."""
        batch = self.scheduler.schedule()
        self.stats_tracker.on_schedule(batch, self.scheduler)
        if not batch:
            return []
        finished: list[RequestOutput] = []
        items, step = self._execute_isolating_faults(batch.items, finished)
        for seq, n in items:
            seq.num_computed_tokens += n
        self.stats_tracker.on_computed(batch, self.scheduler, self.block_manager)
        for seq, first, rows in step.prompt:
            state = self.requests[seq.request_id]
            k = seq.params.prompt_logprobs or 0
            entries = prompt_logprobs_for_rows(rows, seq.prompt_token_ids, first, k)
            state.prompt_logprobs[first + 1 : first + 1 + len(entries)] = entries
        if not step.sample_seqs:
            return finished
        seqs, logits = self._fork(step.sample_seqs, step.logits)
        logits = self.structured.apply_masks(logits, [s.matcher for s in seqs])
        lp_rows = [i for i, s in enumerate(seqs) if s.logprobs is not None]
        raw = log_softmax(logits[lp_rows]) if lp_rows else None  # grammar-masked, before temperature/top-k/top-p
        tokens = sample(logits, [s.params for s in seqs], [s.generator for s in seqs])
        if raw is not None:
            picked = [tokens[i] for i in lp_rows]
            entries = position_logprobs(raw, picked, [seqs[i].params.logprobs for i in lp_rows])
            for i, token, entry in zip(lp_rows, picked, entries, strict=True):
                seqs[i].logprobs.append(entry)
                seqs[i].cumulative_logprob += entry[token].logprob
        for seq, token in zip(seqs, tokens, strict=True):
            seq.token_ids.append(token)
            reason = finish_reason(seq, token, self.eos_token_ids, self.max_model_len, self.stop_matcher)
            if reason is not None:
                self._finish_seq(seq, reason, finished)
        self.stats_tracker.decode_tokens += len(tokens)
        return finished

    def _fork(self, sample_seqs: list[Sequence], logits: torch.Tensor) -> tuple[list[Sequence], torch.Tensor]:
        """After a request's prompt is computed, create its other ``n - 1`` samples: they share
        its full KV blocks, get a copy of its partial block, and sample from the same logits."""
        seqs, rows, copies = list(sample_seqs), list(range(len(sample_seqs))), []
        for row, parent in enumerate(sample_seqs):
            if not parent.pending_forks:
                continue
            state = self.requests[parent.request_id]
            for index in range(1, parent.pending_forks + 1):
                child = self._new_sequence(state, index, parent.arrival)
                pair = self.block_manager.fork(parent, child)
                if pair is not None:
                    copies.append(pair)
                child.num_cached_prompt_tokens = parent.num_cached_prompt_tokens
                child.first_scheduled_step = parent.first_scheduled_step
                self.scheduler.add_running(child)
                self.stats_tracker.on_fork(parent.num_computed_tokens // self.block_manager.block_size, pair)
                seqs.append(child)
                rows.append(row)
            parent.pending_forks = 0
        if len(seqs) == len(sample_seqs):
            return seqs, logits
        self.runner.copy_blocks(copies)
        return seqs, logits[rows]

    def _finish_seq(self, seq: Sequence, reason: str, finished: list[RequestOutput]) -> None:
        self.scheduler.finish(seq, reason)
        self._forget_text(seq)
        state = self.requests[seq.request_id]
        state.num_finished += 1
        if state.finished:
            finished.append(self._build_output(state))
            del self.requests[seq.request_id]

    def _run(self, items: list[tuple[Sequence, int]]) -> StepLogits:
        if self.fault_injector is not None:
            self.fault_injector([s for s, _ in items])
        return self.runner.execute(items)

    def _execute_isolating_faults(self, items, finished: list[RequestOutput]):
        """Run the step; if it raises, rerun its requests one by one so only the request
        that fails on its own is failed (with the error), and the rest go on."""
        try:
            return items, self._run(items)
        except Exception as batch_error:
            # Blocks published this step may hold keys that were never written.
            self.block_manager.forget_blocks([b for s, _ in items for b in s.block_table])
            if len(items) == 1:
                self._fail(items[0][0], batch_error, finished)
                return [], StepLogits()
        kept, parts = [], []
        poisoned: set[int] = set()  # blocks of failed requests: their keys were never written
        for seq, n in items:
            if seq.is_finished:
                continue  # a sample of a request that failed earlier in this loop
            if poisoned.intersection(seq.block_table):
                self.scheduler.preempt(seq)  # it mapped a failed request's prefix this step: recompute
                continue
            try:
                parts.append(self._run([(seq, n)]))
            except Exception as error:
                poisoned.update(seq.block_table)
                self.block_manager.forget_blocks(seq.block_table)
                self._fail(seq, error, finished)
                continue
            kept.append((seq, n))
        return kept, StepLogits.merge(parts)

    def _forget_text(self, seq: Sequence) -> None:
        if self.stop_matcher is not None:
            self.stop_matcher.forget(seq)

    def _fail(self, seq: Sequence, error: Exception, finished: list[RequestOutput]) -> None:
        """Fail the whole request (all its samples) with the error."""
        state = self.requests.pop(seq.request_id)
        state.error = f"request {seq.request_id}: engine step failed: {type(error).__name__}: {error}"
        for s in state.seqs:
            self._forget_text(s)
            if not s.is_finished:
                self.scheduler.abort(s, "error")
        finished.append(self._build_output(state))

    def stats(self) -> dict[str, Any]:
        out = self.stats_tracker.as_dict(self.scheduler, self.block_manager)
        out["structured_output_grammars_compiled"] = self.structured.num_compiled
        return out
