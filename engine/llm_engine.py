"""The step loop: schedule, run the model once, sample, retire finished requests."""

from __future__ import annotations

import itertools
import random
from typing import Any

import torch
from transformers import AutoTokenizer, GenerationConfig

from engine.attention import get_backend
from engine.block_manager import BlockManager
from engine.chat import chat_token_ids
from engine.config import EngineConfig
from engine.cuda_graphs import DecodeGraphs
from engine.device_features import announce, choose_features
from engine.host import tune_for_cpu
from engine.kv_cache import allocate_kv_pool, blocks_from_budget, blocks_from_cuda_memory, bytes_per_block
from engine.model_loader import load_config, load_model
from engine.model_registry import resolve_model
from engine.model_runner import ModelRunner
from engine.outputs import RequestMetrics, RequestOutput
from engine.sampler import make_generator, sample
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.stats import EngineStats


class RequestError(ValueError):
    """A single request is invalid; the message names it. Other requests are unaffected."""


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
        self.tokenizer = self._load_tokenizer()
        self.eos_token_ids = self._eos_token_ids()
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
                num_blocks = self._profile_cuda_blocks(m, backend, kv_dtype, per_block)
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
        self.sequences: dict[str, Sequence] = {}
        self.generators: dict[str, torch.Generator] = {}
        self._arrival = itertools.count()
        self._rng = random.Random(config.seed)
        # Test hook: called with the sequences of every forward pass; raising simulates a fault.
        self.fault_injector = None

    # ---- set-up helpers -------------------------------------------------------------
    def _load_tokenizer(self):
        try:
            return AutoTokenizer.from_pretrained(self.model_dir)
        except (OSError, ValueError):
            return None

    def _eos_token_ids(self) -> set[int]:
        ids: set[int] = set()
        try:
            gen = GenerationConfig.from_pretrained(self.model_dir)
            eos = gen.eos_token_id
            ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        except OSError:
            pass
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    def _profile_cuda_blocks(self, model, backend, kv_dtype: torch.dtype, per_block: int) -> int:
        """Run one step at the full token budget on a throwaway pool to find the activation peak.

        The budget is split into sequences no longer than the context (the rotary table ends
        there), and the probe pool's own bytes are taken out of the peak: the real pool is
        what is being sized.
        """
        dev = torch.device(self.device)
        cfg = self.config
        bs = cfg.block_size
        lengths = []
        left = cfg.max_num_batched_tokens
        while left > 0:
            lengths.append(min(left, self.max_model_len))
            left -= lengths[-1]
        hf = model.config
        probe_blocks = sum(-(-n // bs) for n in lengths)
        probe_pool = allocate_kv_pool(
            hf.num_hidden_layers,
            backend.kv_cache_shape(probe_blocks, bs, hf.num_key_value_heads, model.head_dim),
            kv_dtype, dev,
        )
        runner = ModelRunner(model, backend, probe_pool, bs, self.device)
        items, first_block = [], 0
        for i, n in enumerate(lengths):
            seq = Sequence(f"profile-{i}", [0] * n, SamplingParams(max_tokens=1))
            nb = -(-n // bs)
            seq.block_table = list(range(first_block, first_block + nb))
            first_block += nb
            items.append((seq, n))
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        runner.execute(items)
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev) - probe_pool.numel() * probe_pool.element_size()
        del runner, probe_pool  # the attention layers still view it until the real pool is bound
        return blocks_from_cuda_memory(dev, cfg.gpu_memory_utilization, peak, per_block)

    # ---- requests -------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise RequestError(f"model at {self.model_dir} has no tokenizer: pass token ids")
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
        if request_id in self.sequences:
            raise RequestError(f"request {request_id}: id already in use")
        try:
            if params is None:
                params = SamplingParams()
            elif isinstance(params, dict):
                params = SamplingParams.from_dict(params)
            else:
                params.validate()
        except (TypeError, ValueError) as e:
            raise RequestError(f"request {request_id}: invalid sampling parameters: {e}") from None
        if isinstance(prompt, str):
            token_ids = self.encode(prompt)
        else:
            token_ids = list(prompt)
        if not token_ids:
            raise RequestError(f"request {request_id}: empty prompt")
        vocab = self.model.config.vocab_size
        if any((not isinstance(t, int)) or t < 0 or t >= vocab for t in token_ids):
            raise RequestError(f"request {request_id}: prompt has token ids outside the vocabulary [0, {vocab})")
        if len(token_ids) >= self.max_model_len:
            raise RequestError(
                f"request {request_id}: prompt is {len(token_ids)} tokens, the model's context is "
                f"{self.max_model_len} tokens"
            )
        seq = Sequence(request_id, token_ids, params, arrival=next(self._arrival))
        seq.max_total_tokens = min(len(token_ids) + params.max_tokens, self.max_model_len)
        needed = self.block_manager.blocks_for_tokens(seq.max_total_tokens)
        if needed > self.num_kv_blocks:
            raise RequestError(
                f"request {request_id}: needs {needed} KV blocks ({seq.max_total_tokens} tokens) but the "
                f"cache has {self.num_kv_blocks} blocks in all; it can never run"
            )
        if not params.greedy:
            seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
            self.generators[request_id] = make_generator(seed)
        self.sequences[request_id] = seq
        self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> None:
        seq = self.sequences.pop(request_id, None)
        if seq is not None:
            self.scheduler.abort(seq)
            self.generators.pop(request_id, None)

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
        items, sample_seqs, logits = self._execute_isolating_faults(batch.items, finished)
        for seq, n in items:
            seq.num_computed_tokens += n
        self.stats_tracker.on_computed(batch, self.scheduler, self.block_manager)
        if not sample_seqs:
            return finished
        tokens = sample(logits, [s.params for s in sample_seqs], [self.generators.get(s.request_id) for s in sample_seqs])
        for seq, token in zip(sample_seqs, tokens, strict=True):
            seq.token_ids.append(token)
            reason = self._finish_reason(seq, token)
            if reason is not None:
                self.scheduler.finish(seq, reason)
                finished.append(self._output(seq))
                del self.sequences[seq.request_id]
                self.generators.pop(seq.request_id, None)
        self.stats_tracker.decode_tokens += len(tokens)
        return finished

    def _run(self, items: list[tuple[Sequence, int]]):
        if self.fault_injector is not None:
            self.fault_injector([s for s, _ in items])
        return self.runner.execute(items)

    def _execute_isolating_faults(self, items, finished: list[RequestOutput]):
        """Run the step; if it raises, rerun its requests one by one so only the request
        that fails on its own is failed (with the error), and the rest go on."""
        try:
            sample_seqs, logits = self._run(items)
            return items, sample_seqs, logits
        except Exception as batch_error:
            # Blocks published this step may hold keys that were never written.
            self.block_manager.forget_blocks([b for s, _ in items for b in s.block_table])
            if len(items) == 1:
                self._fail(items[0][0], batch_error, finished)
                return [], [], None
        kept, sample_seqs, rows = [], [], []
        poisoned: set[int] = set()  # blocks of failed requests: their keys were never written
        for seq, n in items:
            if poisoned.intersection(seq.block_table):
                self.scheduler.preempt(seq)  # it mapped a failed request's prefix this step: recompute
                continue
            try:
                one_sample, one_logits = self._run([(seq, n)])
            except Exception as error:
                poisoned.update(seq.block_table)
                self.block_manager.forget_blocks(seq.block_table)
                self._fail(seq, error, finished)
                continue
            kept.append((seq, n))
            sample_seqs += one_sample
            rows.append(one_logits)
        logits = torch.cat(rows) if rows else None
        return kept, sample_seqs, logits

    def _fail(self, seq: Sequence, error: Exception, finished: list[RequestOutput]) -> None:
        self.scheduler.finish(seq, "error")
        out = self._output(seq)
        out.error = f"request {seq.request_id}: engine step failed: {type(error).__name__}: {error}"
        finished.append(out)
        del self.sequences[seq.request_id]
        self.generators.pop(seq.request_id, None)

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        p = seq.params
        if not p.ignore_eos and token in self.eos_token_ids:
            return "stop"
        if token in p.stop_token_ids:
            return "stop"
        if p.stop and self.tokenizer is not None:
            text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
            cut = min((i for i in (text.find(s) for s in p.stop) if i >= 0), default=-1)
            if cut >= 0:
                seq.stop_text_end = cut
                return "stop"
        if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _output(self, seq: Sequence) -> RequestOutput:
        text = ""
        if self.tokenizer is not None:
            text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
            if seq.stop_text_end is not None:
                text = text[: seq.stop_text_end]
        return RequestOutput(
            request_id=seq.request_id,
            prompt_token_ids=list(seq.prompt_token_ids),
            token_ids=list(seq.output_token_ids),
            text=text,
            finished=True,
            finish_reason=seq.finish_reason,
            metrics=RequestMetrics(
                num_cached_prompt_tokens=seq.num_cached_prompt_tokens,
                num_preemptions=seq.num_preemptions,
                first_scheduled_step=seq.first_scheduled_step,
                finished_step=seq.finished_step,
            ),
        )

    def stats(self) -> dict[str, Any]:
        return self.stats_tracker.as_dict(self.scheduler, self.block_manager)
