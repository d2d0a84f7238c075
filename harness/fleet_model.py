"""The ``tokenmill`` harness model with its requests run as tokenmill jobs, on the Celery fleet:
``--model tokenmill --model_args model=...,work_dir=s3://bucket/evals,broker=redis://...``.

Everything that decides a number is ``TokenmillLM``'s: tokenization, truncation, rolling
windows, ``gen_kwargs``, stop strings (this class inherits them). Only where the prompts run
differs: each harness call's distinct requests become the rows of a ``harness_requests`` job
(``harness.fleet_job``), split into shards that the workers run with cross-shard feeding and
prefix sharing; the harness reads each request's result back from the job's parts. This
process loads the tokenizer and the model's config, never its weights.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from engine.model_loader import load_config, load_tokenizer
from engine.model_registry import DEFAULT_MODEL, resolve_model
from engine.sampling_params import SamplingParams
from harness.fleet_job import FleetSettings, JobRun, job_spec, read_results, run_job
from harness.model_base import TokenmillBase, engine_settings
from pipeline.token_requests import ROW_BEAM_SEARCH, ROW_SAMPLING

log = logging.getLogger("lm_eval.models.tokenmill")


class FleetLM(TokenmillBase):
    """``FleetLM(model=..., work_dir=..., broker=...)``: the fleet (or, without ``broker``, this
    process) runs the requests; engine settings in the model_args go into the job's ``[model]``."""

    def __init__(
        self,
        work_dir: str,
        broker: str | None = None,
        model: str | None = None,
        pretrained: str | None = None,
        dtype: str = "float32",
        max_length: int | None = None,
        max_gen_toks: int = 256,
        add_bos_token: bool | None = None,
        prefix_token_id: int | None = None,
        seed: int = 1234,
        progress: bool = True,
        queue: str | None = None,
        result_backend: str | None = None,
        shard_rows: int = 256,
        timeout_s: float | None = None,
        poll_s: float = 1.0,
        device: str | None = None,  # the workers' engines pick their device
        batch_size: Any = None,  # accepted for the CLI's sake, as by harness.model's TokenmillLM
        max_batch_size: Any = None,
        **engine_args: Any,
    ) -> None:
        super().__init__()
        settings = engine_settings(engine_args)

        name = str(model or pretrained or DEFAULT_MODEL)
        model_dir = resolve_model(name)
        positions = load_config(model_dir).max_position_embeddings
        # the engine's rule (LLMEngine): the asked context, at most the model's positions
        max_model_len = min(int(max_length) + 2, positions) if max_length is not None else positions
        self._take_settings(load_tokenizer(model_dir), max_model_len, max_length, max_gen_toks, add_bos_token,
                            prefix_token_id, seed, progress)
        self.engine = {"model": name, "dtype": dtype, "max_model_len": max_model_len,
                       **settings}
        self.settings = FleetSettings(str(work_dir), broker or None, queue, result_backend, int(shard_rows),
                                      None if timeout_s is None else float(timeout_s), float(poll_s))
        self.jobs: list[JobRun] = []  # one per harness call

    def stats(self) -> dict[str, Any]:
        return {"jobs": [run.manifest.get("totals", {}) for run in self.jobs]}

    def _score(self, prompts: list[list[int]], starts: list[int], disable_tqdm: bool) -> list[tuple[float, bool]]:
        rows = [{"prompt": p, "score_from": s} for p, s in zip(prompts, starts, strict=True)]
        return [(float(r["logprob"]), bool(r["is_greedy"])) for r in self._run("loglikelihood", rows, disable_tqdm)]

    def _generate(self, prompts: list[list[int]], params: list[SamplingParams], disable_tqdm: bool) -> list[str]:
        rows = [{"prompt": p, "sampling": _row_sampling(s)} for p, s in zip(prompts, params, strict=True)]
        return [r["output"] or "" for r in self._run("generate_until", rows, disable_tqdm)]

    def _run(self, what: str, requests: list[dict[str, Any]], disable_tqdm: bool) -> list[dict[str, Any]]:
        """Each request's result row, in order: identical requests are one row of the job, and
        rows are sorted by their tokens so requests sharing a context sit in the same shard."""
        if not requests:
            return []  # a job needs at least one request file
        distinct: dict[str, dict[str, Any]] = {}
        keys = []
        for request in requests:
            key = _key(request)
            distinct.setdefault(key, request)
            keys.append(key)
        order = sorted(distinct, key=lambda k: distinct[k]["prompt"])
        ids = {k: f"{i:07d}" for i, k in enumerate(order)}
        rows = [{"id": ids[k], "text": what, **distinct[k]} for k in order]
        spec, files = job_spec(what, rows, self.engine, self.settings)
        job_id, manifest = run_job(spec, files, self.settings, len(rows), self.progress and not disable_tqdm)
        run = JobRun(what, len(requests), len(rows), job_id, spec.output.url, manifest)
        self.jobs.append(run)
        log.info(run.summary())
        results = read_results(spec, manifest)
        return [results[ids[k]] for k in keys]


def _key(request: dict[str, Any]) -> str:
    return json.dumps(request, sort_keys=True, separators=(",", ":"))


def _row_sampling(params: SamplingParams) -> dict[str, Any]:
    """A row's own settings; the beam-search ones only when set, so rows without beams (and the
    parts already computed from them) stay as they were."""
    values = params.to_dict()
    return {k: v for k, v in values.items()
            if k in ROW_SAMPLING and not (k in ROW_BEAM_SEARCH and v == _PLAIN[k])}


_PLAIN = SamplingParams().to_dict()
