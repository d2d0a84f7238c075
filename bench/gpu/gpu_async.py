"""Issue 26 on one GPU: synchronous vs async scheduling in the same process, on the summarisation
job of the last GPU run (random weights in Llama-3.2-1B's shape, bfloat16, EOS ignored).

    PYTHONPATH=$PWD python bench/gpu/gpu_async.py --out $OUT/gpu-async.json --requests 1024 256

For each request count and engine setting one engine is built; after an untimed pass (Triton
compiles) it runs timed passes alternating ``async_scheduling`` off and on (off, on, off, on), each
on the same shifted prompts per pair so the tokens can be compared. Per step it records the host
time of each part and the device time between CUDA events around the forward pass and sampling.
Then an eager (no graphs, synchronous) engine gives the reference tokens, and a seeded-sampling
pass checks that the device sampler gives the same tokens with async scheduling on and off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import LLAMA_1B, Recorder, build_model, device_meta  # noqa: E402
from gpu_throughput import ceilings, floor_seconds, free  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402
from engine.attention.triton_backend import DecodeLaunch  # noqa: E402

try:  # --timed also runs trees from before ExtendLaunch
    from engine.attention.triton_backend import ExtendLaunch  # noqa: E402
except ImportError:
    ExtendLaunch = None

CUDA = torch.cuda.is_available()  # --small runs the script on a CPU, without device timings
# "before" in --ab: the launches of the previous round (the decode launch tuned by decode_tune.py,
# the extend launch before extend_tune.py); "after" takes this tree's defaults.
BEFORE_LAUNCH = DecodeLaunch(block_n=128, num_warps=4, num_stages=4, min_partition=512, target_programs=2048, max_splits=16)
BEFORE_EXTEND = ExtendLaunch(block_m=64, block_n=64, num_warps=4, num_stages=3) if ExtendLaunch else None


class _NoEvent:
    def record(self) -> None: ...

    def elapsed_time(self, other) -> float:
        return 0.0


def event():
    return torch.cuda.Event(enable_timing=True) if CUDA else _NoEvent()


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


class Probe:
    """Host seconds per part of a step and device milliseconds per launched forward pass."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.host = dict.fromkeys(("schedule", "prepare", "forward_launch", "sample_launch", "wait", "apply",
                                   "outputs"), 0.0)
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.shapes: list[tuple[str, int, int, int]] = []  # per step: graph/mixed/eager, prefill tokens and seqs, seqs
        self.step_host: list[tuple[int, float]] = []  # per engine.step: (forward passes so far, host seconds minus waits)
        self._wait_in_step = 0.0
        self.pass_start, self.pass_end = event(), event()
        self._wrap(engine.scheduler, "schedule", "schedule")
        self._wrap(engine.runner, "prepare", "prepare")
        self._wrap(engine.runner, "sample_tokens", "sample_launch")
        self._wrap(engine, "_apply", "apply")
        self._wrap(engine.output_processor, "build", "outputs")
        step = engine.step

        def timed_step():
            self._wait_in_step = 0.0
            t = time.perf_counter()
            try:
                return step()
            finally:
                self.step_host.append((len(self.events), time.perf_counter() - t - self._wait_in_step))

        engine.step = timed_step
        runner = engine.runner
        forward = runner._forward

        def timed_forward(inputs):
            meta = inputs.meta
            mixed = getattr(runner, "mixed_graphs", None)
            kind = ("graph" if runner.decode_graphs is not None and runner.decode_graphs.can_run(meta)
                    else "mixed" if mixed is not None and mixed.can_run(meta) else "eager")
            shape = (kind, meta.num_tokens - meta.num_decodes, meta.num_seqs - meta.num_decodes, meta.num_seqs)
            start, end = event(), event()
            start.record()
            t = time.perf_counter()
            out = forward(inputs)
            self.host["forward_launch"] += time.perf_counter() - t
            end.record()
            self.events.append((start, end))
            self.shapes.append(shape)
            return out

        runner._forward = timed_forward
        self._wrap_wait()

    def _wrap(self, obj, name: str, key: str) -> None:
        inner = getattr(obj, name)

        def timed(*a, **kw):
            t = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                self.host[key] += time.perf_counter() - t

        setattr(obj, name, timed)

    def _wrap_wait(self) -> None:
        """The time the host blocks on the device: the token copy (sync: inside _sample's .tolist)."""
        eng = self.engine
        collect, sample = eng._collect, eng._sample

        def timed_collect(step, finished):
            t = time.perf_counter()
            tokens = step.wait()
            self.host["wait"] += time.perf_counter() - t
            self._wait_in_step += time.perf_counter() - t
            step.wait = lambda: tokens
            return collect(step, finished)

        def timed_sample(seqs, logits):
            t = time.perf_counter()
            sync()
            self.host["wait"] += time.perf_counter() - t
            self._wait_in_step += time.perf_counter() - t
            return sample(seqs, logits)

        eng._collect, eng._sample = timed_collect, timed_sample

    def reset(self) -> None:
        self.host = dict.fromkeys(self.host, 0.0)
        self.events = []
        self.shapes = []
        self.step_host = []
        self.pass_start = event()
        self.pass_start.record()  # reset() comes just before a timed pass's generate()
        self.pass_end = event()

    def end_pass(self) -> None:
        self.pass_end.record()

    def result(self, wall: float, steps: int) -> dict:
        sync()
        device = [s.elapsed_time(e) for s, e in self.events]
        host = {k: round(1e3 * v / max(steps, 1), 3) for k, v in self.host.items()}
        host["other"] = round(1e3 * wall / max(steps, 1) - sum(host.values()), 3)
        return {"steps": steps, "wall_ms_per_step": round(1e3 * wall / max(steps, 1), 3), "host_ms_per_step": host,
                "host_ms_excluding_wait": round(sum(v for k, v in host.items() if k != "wait"), 3),
                "device_ms_per_step_mean": round(statistics.mean(device), 3) if device else None,
                "device_ms_per_step_median": round(statistics.median(device), 3) if device else None,
                "device_busy_fraction": round(sum(device) / 1e3 / wall, 3) if device else None,
                "device_by_step_kind": by_kind(device, self.shapes), "idle": self.idle(device, wall)}

    def idle(self, device: list[float], wall: float) -> dict:
        """Where the device waits: the gap between one forward pass's end and the next one's
        start (CUDA events; the sampler, the token copy and the next inputs' copy run in it),
        summed by the kind of the step that follows, beside the host's own time (waits left
        out) in the engine steps that launched such steps; plus the head (pass start to the
        first forward) and the tail (last forward's end to the pass's end)."""
        if not CUDA or not self.events:
            return {}
        end = self.pass_end
        sync()
        gaps = [0.0] + [self.events[i - 1][1].elapsed_time(self.events[i][0]) for i in range(1, len(self.events))]
        launched_by = {}  # forward pass index -> host seconds of the engine step that launched it
        for count, host_s in self.step_host:
            if count:
                launched_by.setdefault(count - 1, host_s)
        out: dict[str, dict] = {}
        for i, (gap, shape) in enumerate(zip(gaps, self.shapes, strict=False)):
            key = next(iter(by_kind([device[i]], [shape])))
            g = out.setdefault(key, {"steps": 0, "gap_ms_total": 0.0, "gaps_over_0_2ms": 0, "host_ms_total": 0.0,
                                     "device_ms_total": 0.0})
            g["steps"] += 1
            g["gap_ms_total"] += gap
            g["gaps_over_0_2ms"] += gap > 0.2
            g["host_ms_total"] += 1e3 * launched_by.get(i, 0.0)
            g["device_ms_total"] += device[i]
        for g in out.values():
            for k in ("gap_ms_total", "host_ms_total", "device_ms_total"):
                g[k] = round(g[k], 2)
        head = self.pass_start.elapsed_time(self.events[0][0])
        tail = self.events[-1][1].elapsed_time(end)
        return {"by_kind": dict(sorted(out.items())), "head_ms": round(head, 2), "tail_ms": round(tail, 2),
                "gaps_ms_total": round(sum(gaps), 2), "wall_ms": round(1e3 * wall, 2)}


def by_kind(device: list[float], shapes: list[tuple[str, int, int, int]]) -> dict:
    """Device ms summed over decode-graph steps grouped by their rows, and over piecewise-graph
    ("mixed") and eager steps grouped by their prefill tokens: where graphs or faster kernels pay."""
    groups: dict[str, list[tuple[float, int, int]]] = {}
    edges = (0, 64, 256, 1024, 4096, 1 << 30)
    for ms, (kind, tokens, seqs, rows) in zip(device, shapes, strict=False):
        if kind == "graph":
            key = "graph_rows_le_" + str(next(e for e in (16, 64, 256, 1024, 1 << 30) if rows <= e))
        else:
            hi = next(e for e in edges if tokens <= e)
            key = f"{kind}_prefill_le_{hi}" if hi < edges[-1] else f"{kind}_prefill_gt_4096"
        groups.setdefault(key, []).append((ms, tokens, seqs))
    return {k: {"steps": len(v), "device_ms_total": round(sum(x[0] for x in v), 2),
                "device_ms_mean": round(statistics.mean(x[0] for x in v), 3),
                "prefill_tokens_total": sum(x[1] for x in v), "prefill_seqs_mean": round(statistics.mean(x[2] for x in v), 2)}
            for k, v in sorted(groups.items())}


def shifted(prompts, shift: int, vocab: int):
    return [[(t + shift) % vocab for t in p] for p in prompts]


def run_setting(model_dir: Path, prompts, budgets, settings: dict, pairs: int, ceil: dict) -> dict:
    t0 = time.perf_counter()
    llm = LLM(str(model_dir), **settings)
    startup = time.perf_counter() - t0
    eng = llm.engine
    vocab = eng.runner.model.config.vocab_size
    params = [SamplingParams(max_tokens=b, temperature=0, ignore_eos=True) for b in budgets]
    eng.async_scheduling = True
    llm.generate(shifted(prompts, 1, vocab), params)  # untimed: compiles every Triton variant
    eng.async_scheduling = False
    llm.generate(shifted(prompts, 2, vocab), params)
    probe = Probe(eng)
    graphs, mixed = eng.runner.decode_graphs, eng.runner.mixed_graphs
    passes, tokens = [], {}
    for pair in range(pairs):
        for mode in (False, True):
            eng.async_scheduling = mode  # the same prompts for both modes of a pair
            rec, outs = timed_pass(llm, probe, prompts, budgets, params, 10 + pair, ceil)
            rec = {"pair": pair, "async": mode} | rec
            tokens[(pair, mode)] = [o.token_ids for o in outs]
            passes.append(rec)
            print(f"  {settings} pair {pair} async={mode}: {rec['wall_s']:.3f}s {rec['output_tok_per_s']:.0f} tok/s "
                  f"floor {rec['fraction_of_floor']:.0%} steps {rec['steps']} graphs {rec['graph_coverage']:.0%} "
                  f"host {rec['host_ms_per_step']} device {rec['device_ms_per_step_mean']} ms", flush=True)
    identical = sum(a == b for pair in range(pairs) for a, b in zip(tokens[(pair, False)], tokens[(pair, True)], strict=True))
    ratios = [next(p["wall_s"] for p in passes if p["pair"] == k and not p["async"])
              / next(p["wall_s"] for p in passes if p["pair"] == k and p["async"]) for k in range(pairs)]
    res = {"settings": settings, "startup_s": round(startup, 2), "passes": passes,
           "sync_over_async_wall_ratio_per_pair": [round(r, 4) for r in ratios],
           "sync_over_async_median": round(statistics.median(ratios), 4),
           "async_vs_sync_identical_prompts": identical, "compared_prompts": pairs * len(prompts),
           "graph_capture_s": graphs.capture_seconds if graphs else None,
           "mixed_graph_capture_s": mixed.capture_seconds if mixed else None}
    ref = (tokens[(0, False)], tokens[(0, True)])
    del llm, eng, probe, graphs, mixed
    free()
    return res | {"_tokens_pair0": ref}


def timed_pass(llm, probe: Probe, prompts, budgets, params, shift: int, ceil: dict) -> tuple[dict, list]:
    """One timed async-or-sync pass of ``llm`` over the shifted prompts, fresh prefix cache: its
    record (wall, floor, graph coverage, the probe's parts and idle) and the outputs."""
    eng = llm.engine
    vocab = eng.runner.model.config.vocab_size
    graphs, mixed = eng.runner.decode_graphs, eng.runner.mixed_graphs
    steps0, graph0, mixed0 = eng.stats()["steps"], graphs.steps if graphs else 0, mixed.steps if mixed else 0
    eng.block_manager.reset_prefix_cache()
    sync()
    probe.reset()  # after the reset: the pass's head idle is generate()'s own
    t = time.perf_counter()
    outs = llm.generate(shifted(prompts, shift, vocab), params)
    probe.end_pass()
    sync()
    wall = time.perf_counter() - t
    steps = eng.stats()["steps"] - steps0
    cfg = eng.runner.model.config
    floor = floor_seconds(prompts, budgets, steps, sum(p.numel() for p in eng.runner.model.parameters()),
                          2 * cfg.num_hidden_layers * cfg.num_key_value_heads * eng.runner.model.head_dim * 2, ceil)
    out_tokens = sum(len(o.token_ids) for o in outs)
    graph_steps, mixed_steps = (graphs.steps - graph0 if graphs else 0), (mixed.steps - mixed0 if mixed else 0)
    rec = {"wall_s": round(wall, 4), "floor_s": round(floor["floor_s"], 4),
           "fraction_of_floor": round(floor["floor_s"] / wall, 4), "errors": sum(o.error is not None for o in outs),
           "output_tokens": out_tokens, "expected_output_tokens": sum(budgets),
           "output_tok_per_s": round(out_tokens / wall, 1), "graph_steps": graph_steps, "mixed_graph_steps": mixed_steps,
           "graph_coverage": round((graph_steps + mixed_steps) / max(steps, 1), 4)}
    return rec | probe.result(wall, steps), outs


def ab_setting(model_dir: Path, prompts, budgets, settings: dict, pairs: int, ceil: dict,
               after_extra: dict | None = None) -> dict:
    """Before/after in one process: an engine with the previous round's launches (BEFORE_LAUNCH,
    BEFORE_EXTEND) and one with this tree's defaults, both alive; timed async passes alternate
    between them (the order flips each pair), then one sync pass of "after" checks async = sync."""
    from engine.attention import triton_backend

    default_launch, default_extend = triton_backend.DEFAULT_DECODE, triton_backend.DEFAULT_EXTEND
    # with after_extra (engine settings of "after" only), both engines take this tree's launches
    before_launches = (BEFORE_LAUNCH, BEFORE_EXTEND) if after_extra is None else (default_launch, default_extend)
    engines = {}
    try:
        for name, (launch, extend), extra, util in (("before", before_launches, {}, 0.42),
                                                    ("after", (default_launch, default_extend), after_extra or {}, 0.88)):
            triton_backend.DEFAULT_DECODE, triton_backend.DEFAULT_EXTEND = launch, extend
            engines[name] = LLM(str(model_dir), **(settings | extra | {"gpu_memory_utilization": util}))
    finally:
        triton_backend.DEFAULT_DECODE, triton_backend.DEFAULT_EXTEND = default_launch, default_extend
    vocab = engines["after"].engine.runner.model.config.vocab_size
    params = [SamplingParams(max_tokens=b, temperature=0, ignore_eos=True) for b in budgets]
    probes = {}
    for name, llm in engines.items():
        llm.engine.async_scheduling = True
        llm.generate(shifted(prompts, 1, vocab), params)  # untimed: compiles every Triton variant
        probes[name] = Probe(llm.engine)
    passes, tokens = [], {}
    for pair in range(pairs):
        for name in (("before", "after") if pair % 2 == 0 else ("after", "before")):
            rec, outs = timed_pass(engines[name], probes[name], prompts, budgets, params, 10 + pair, ceil)
            rec = {"pair": pair, "engine": name} | rec
            tokens[(pair, name)] = [o.token_ids for o in outs]
            passes.append(rec)
            wall, steps = rec["wall_s"], rec["steps"]
            print(f"  ab {name:6s} pair {pair}: {wall:.3f}s floor {rec['fraction_of_floor']:.0%} steps {steps} "
                  f"graphs {rec['graph_coverage']:.0%} host {rec['host_ms_excluding_wait']} ms "
                  f"device {rec['device_ms_per_step_mean']} ms busy {rec['device_busy_fraction']}", flush=True)
    after = engines["after"]
    after.engine.async_scheduling = False
    after.engine.block_manager.reset_prefix_cache()
    sync_tokens = [o.token_ids for o in after.generate(shifted(prompts, 10, vocab), params)]
    ratios = [next(p["wall_s"] for p in passes if p["pair"] == k and p["engine"] == "before")
              / next(p["wall_s"] for p in passes if p["pair"] == k and p["engine"] == "after") for k in range(pairs)]
    res = {"settings": settings, "before": {"decode_launch": before_launches[0].__dict__, "extend_launch": before_launches[1].__dict__},
           "after": {"decode_launch": default_launch.__dict__, "extend_launch": default_extend.__dict__,
                     "settings": after_extra or {}}, "passes": passes,
           "before_over_after_per_pair": [round(r, 4) for r in ratios],
           "before_over_after_median": round(statistics.median(ratios), 4),
           "after_fraction_of_floor": [p["fraction_of_floor"] for p in passes if p["engine"] == "after"],
           "after_async_vs_sync_identical": sum(a == b for a, b in zip(tokens[(0, "after")], sync_tokens, strict=True)),
           "before_vs_after_identical": sum(a == b for a, b in zip(tokens[(0, "before")], tokens[(0, "after")], strict=True)),
           "compared_prompts": len(prompts)}
    del engines, probes, after
    free()
    return res


def timed_passes(model_dir: Path, prompts, budgets, settings: dict, passes: int, ceil: dict) -> dict:
    """One async engine of this tree: an untimed pass, then ``passes`` timed ones with the probe.
    bench/gpu/issue26_host_call.sh runs it from two trees in alternating processes."""
    llm = LLM(str(model_dir), **(settings | {"async_scheduling": True}))
    eng = llm.engine
    vocab = eng.runner.model.config.vocab_size
    params = [SamplingParams(max_tokens=b, temperature=0, ignore_eos=True) for b in budgets]
    llm.generate(shifted(prompts, 1, vocab), params)  # compiles
    probe = Probe(eng)
    out = []
    for k in range(passes):
        rec, outs = timed_pass(llm, probe, prompts, budgets, params, 10 + k, ceil)
        rec = {"pass": k} | rec
        out.append(rec)
        wall, steps = rec["wall_s"], rec["steps"]
        if k == 0:
            tokens0 = [o.token_ids for o in outs]
        print(f"  timed pass {k}: {wall:.3f}s floor {rec['fraction_of_floor']:.0%} steps {steps} "
              f"host {rec['host_ms_excluding_wait']} ms device {rec['device_ms_per_step_mean']} ms "
              f"busy {rec['device_busy_fraction']} idle {rec.get('idle', {}).get('gaps_ms_total')} ms "
              f"head {rec.get('idle', {}).get('head_ms')} ms", flush=True)
    eng.async_scheduling = False  # the same prompts as pass 0, synchronously: greedy tokens must agree
    eng.block_manager.reset_prefix_cache()
    sync_tokens = [o.token_ids for o in llm.generate(shifted(prompts, 10, vocab), params)]
    same = sum(a == b for a, b in zip(tokens0, sync_tokens, strict=True))
    print(f"  async = sync for {same}/{len(prompts)} prompts", flush=True)
    del llm, eng, probe
    free()
    return {"settings": settings, "passes": out, "async_vs_sync_identical": same, "compared_prompts": len(prompts)}


def profile_pass(model_dir: Path, prompts, budgets, settings: dict, out: Path) -> dict:
    """torch.profiler over one async pass: device time per kernel (table written to ``out``)."""
    from torch.profiler import ProfilerActivity, profile

    llm = LLM(str(model_dir), **(settings | {"async_scheduling": True}))
    vocab = llm.engine.runner.model.config.vocab_size
    params = [SamplingParams(max_tokens=b, temperature=0, ignore_eos=True) for b in budgets]
    llm.generate(shifted(prompts, 1, vocab), params)  # compiles
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])
    with profile(activities=acts) as prof:
        llm.generate(shifted(prompts, 7, vocab), params)
        sync()
    avg = prof.key_averages()
    key = "self_device_time_total" if CUDA else "self_cpu_time_total"
    out.write_text(avg.table(sort_by=key, row_limit=45, max_name_column_width=70))
    top = sorted(avg, key=lambda e: -getattr(e, key, 0))[:25]
    del llm
    free()
    return {"table": out.name, "top_us": {e.key[:70]: round(getattr(e, key, 0), 1) for e in top},
            "total_device_us": round(sum(getattr(e, key, 0) for e in avg), 1)}


def eager_reference(model_dir: Path, prompts, budgets, settings: dict, refs) -> dict:
    llm = LLM(str(model_dir), **(settings | {"enforce_eager": True, "async_scheduling": False}))
    vocab = llm.engine.runner.model.config.vocab_size
    params = [SamplingParams(max_tokens=b, temperature=0, ignore_eos=True) for b in budgets]
    t = time.perf_counter()
    outs = llm.generate(shifted(prompts, 10, vocab), params)
    wall = time.perf_counter() - t
    out = {"eager_sync_wall_s": round(wall, 3), "prompts": len(prompts)}
    for name, ref_tokens in zip(("graph_sync", "graph_async"), refs, strict=True):
        out[f"identical_to_{name}"] = sum(o.token_ids == r for o, r in zip(outs, ref_tokens, strict=True))
        first = [next((j for j, (x, y) in enumerate(zip(o.token_ids, r, strict=False)) if x != y), None)
                 for o, r in zip(outs, ref_tokens, strict=True)]
        out[f"first_diff_steps_{name}"] = [d for d in first if d is not None][:40]
    del llm
    free()
    return out


def seeded_check(model_dir: Path, prompts, settings: dict) -> dict:
    """Device sampler: the same seeds give the same tokens with async on and off, and alone."""
    llm = LLM(str(model_dir), **settings)
    vocab = llm.engine.runner.model.config.vocab_size
    params = [SamplingParams(max_tokens=32, temperature=0.8, top_p=0.95, top_k=50, seed=i, ignore_eos=True)
              for i in range(len(prompts))]
    got = {}
    for mode in (False, True):  # each pass from a cold prefix cache: a hit computes the last prompt
        llm.engine.async_scheduling = mode  # token's logits on another path, which can flip a near-tie
        llm.engine.block_manager.reset_prefix_cache()
        got[mode] = [o.token_ids for o in llm.generate(shifted(prompts, 3, vocab), params)]
    llm.engine.block_manager.reset_prefix_cache()
    alone = [o.token_ids for o in llm.generate(shifted(prompts[:8], 3, vocab), params[:8])]
    del llm
    free()
    return {"prompts": len(prompts), "async_equals_sync": sum(a == b for a, b in zip(got[False], got[True], strict=True)),
            "batch_of_8_equals_full_batch": sum(a == b for a, b in zip(alone, got[True][:8], strict=True)),
            "distinct_first_tokens": len({t[0] for t in got[True]}),
            "first_diff_positions": [next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
                                     for a, b in zip(got[False], got[True], strict=True) if a != b]}


def greedy_equal(model_dir: Path, prompts, budgets, settings: dict) -> dict:
    """float32 greedy tokens, async vs sync on one engine: a bfloat16 model's logits move with the
    batch's shape, float32 ones almost never enough to flip an argmax."""
    llm = LLM(str(model_dir), **(settings | {"dtype": "float32"}))
    vocab = llm.engine.runner.model.config.vocab_size
    params = [SamplingParams(max_tokens=b, temperature=0, ignore_eos=True) for b in budgets]
    got, walls = {}, {}
    for mode in (False, True):
        llm.engine.async_scheduling = mode
        llm.engine.block_manager.reset_prefix_cache()
        t = time.perf_counter()
        got[mode] = [o.token_ids for o in llm.generate(shifted(prompts, 5, vocab), params)]
        walls[mode] = time.perf_counter() - t
    del llm
    free()
    return {"prompts": len(prompts), "identical": sum(a == b for a, b in zip(got[False], got[True], strict=True)),
            "wall_s_sync": round(walls[False], 3), "wall_s_async": round(walls[True], 3)}


def logprobs_on_device(model_dir: Path, prompts, settings: dict) -> dict:
    """Logprobs and prompt logprobs computed on the GPU: greedy tokens rank 1, every position filled."""
    llm = LLM(str(model_dir), **settings)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=3, prompt_logprobs=2)
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - t
    ranks = [e[tok].rank for o in outs for tok, e in zip(o.token_ids, o.outputs[0].logprobs, strict=True)]
    prompt_ok = sum(len(o.prompt_logprobs) == len(p) and o.prompt_logprobs[0] is None
                    and all(e is not None and 1 <= len(e) <= 3 for e in o.prompt_logprobs[1:])
                    for o, p in zip(outs, prompts, strict=True))
    del llm
    free()
    return {"requests": len(prompts), "errors": sum(o.error is not None for o in outs), "wall_s": round(wall, 3),
            "sampled_tokens": len(ranks), "rank_1": sum(r == 1 for r in ranks), "prompt_logprobs_complete": prompt_ok}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--requests", type=int, nargs="+", default=[1024, 256])
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--workload", type=Path, default=Path(__file__).with_name("summ-1024.json"))
    ap.add_argument("--skip", nargs="*", default=[], help="sections to leave out: defaults float32 logprobs seeded")
    ap.add_argument("--extra-tuned", nargs="*", default=[], metavar="SEQS:TOKENS",
                    help="more max_num_seqs:max_num_batched_tokens settings run at the first request count")
    ap.add_argument("--profile", action="store_true", help="a torch.profiler table of one tuned async pass")
    ap.add_argument("--small", action="store_true", help="a tiny model (to try the script on a CPU)")
    ap.add_argument("--ab", nargs="*", default=[], metavar="REQUESTS:SEQS:TOKENS",
                    help="before/after A/B runs (ab_setting) in place of the sections; e.g. 1024:1024:8192 256:512:8192")
    ap.add_argument("--after-config", nargs="*", default=[], metavar="KEY=INT",
                    help="--ab: engine settings of the after engine only (both then take this tree's launches)")
    ap.add_argument("--timed", default=None, metavar="REQUESTS:SEQS:TOKENS",
                    help="only timed_passes (async, this tree) for --pairs passes, in place of the sections")
    args = ap.parse_args()
    rec = Recorder(args.out, device_meta() | {"script": "bench/gpu/gpu_async.py", "argv": sys.argv[1:]})
    wl = json.loads(args.workload.read_text())
    shape = dict(LLAMA_1B) | (dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32) if args.small else {})
    model_dir = rec.run("build-1b", lambda: build_model(Path(tempfile.mkdtemp()) / "llama-1b-shape",
                                                         "cuda" if CUDA else "cpu", dtype=torch.bfloat16, **shape))
    ceil = (rec.run("ceilings", ceilings) if CUDA else None) or {"copy_tb_per_s": 4.3, "bf16_matmul_tflops": 790.0}
    base = dict(dtype="bfloat16", max_model_len=4096)
    tuned = base | dict(max_num_seqs=512, max_num_batched_tokens=8192)
    if args.timed:
        n, seqs, tokens = (int(x) for x in args.timed.split(":"))
        settings = base | dict(max_num_seqs=seqs, max_num_batched_tokens=tokens)
        rec.run(f"timed-{seqs}-{tokens}/{n}", lambda: timed_passes(
            model_dir, wl["prompts"][:n], wl["max_tokens"][:n], settings, args.pairs, ceil))
        rec.path.write_text(json.dumps(rec.data, indent=1, default=str))
        return
    for spec in args.ab:
        n, seqs, tokens = (int(x) for x in spec.split(":"))
        settings = base | dict(max_num_seqs=seqs, max_num_batched_tokens=tokens)
        extra = {k: int(v) for k, v in (kv.split("=") for kv in args.after_config)} or None
        rec.run(f"ab-{seqs}-{tokens}/{n}", lambda s=settings, n=n, e=extra: ab_setting(
            model_dir, wl["prompts"][:n], wl["max_tokens"][:n], s, args.pairs, ceil, e))
        free()
    for n in (args.requests if not args.ab else []):
        prompts, budgets = wl["prompts"][:n], wl["max_tokens"][:n]
        variants = [("tuned", tuned), ("defaults", base)]  # the engine's: 1,024 and 8,192 on an H100/H200 since 6a41716
        if n == args.requests[0]:  # the piecewise graphs' A/B: the same job with them off
            variants.insert(1, ("tuned-no-mixed-graphs", tuned | {"mixed_graph_max_tokens": 0}))
            for spec in args.extra_tuned:
                seqs, tokens = (int(x) for x in spec.split(":"))
                variants.append((f"tuned-{seqs}-{tokens}", base | dict(max_num_seqs=seqs, max_num_batched_tokens=tokens)))
        for name, settings in variants:
            if name in args.skip:
                continue
            res = rec.run(f"{name}/{n}", lambda s=settings, p=prompts, b=budgets: run_setting(model_dir, p, b, s, args.pairs, ceil))
            if res and name == "tuned" and n == args.requests[0]:
                ref = res.pop("_tokens_pair0")
                rec.run(f"eager-reference/{n}", lambda r=ref, s=settings, p=prompts, b=budgets: eager_reference(model_dir, p, b, s, r))
            elif res:
                res.pop("_tokens_pair0", None)
            free()  # a failed section leaves its engine to the collector
    n = args.requests[0]
    if args.profile:
        prof = base | dict(max_num_seqs=1024, max_num_batched_tokens=8192) if args.ab else tuned
        rec.run(f"profile/{n}", lambda: profile_pass(model_dir, wl["prompts"][:n], wl["max_tokens"][:n], prof,
                                                      args.out.with_name(f"profile-{n}.txt")))
    if "float32" not in args.skip:
        rec.run(f"float32-greedy-async-vs-sync/{n}",
                lambda: greedy_equal(model_dir, wl["prompts"][:n], wl["max_tokens"][:n], tuned))
    if "logprobs" not in args.skip:
        rec.run("logprobs-on-device", lambda: logprobs_on_device(model_dir, wl["prompts"][:64], tuned))
    # float32: a bfloat16 model's logits move with the batch's shape, and so would any sample
    if "seeded" not in args.skip:
        rec.run("seeded-device-sampler", lambda: seeded_check(model_dir, wl["prompts"][:64], tuned | {"dtype": "float32"}))
    rec.path.write_text(json.dumps(rec.data, indent=1, default=str))
    print("\nSUMMARY gpu_async")
    for name, e in rec.data["sections"].items():
        r = e.get("result") if e["ok"] else None
        if isinstance(r, dict) and "passes" in r:
            for p in r["passes"]:
                label = p.get("engine") or f"async={p['async']!s:5s}"
                print(f"  {name:16s} {label:11s} pair {p['pair']} {p['wall_s']:7.3f}s floor {p['fraction_of_floor']:.0%} "
                      f"graphs {p['graph_coverage']:.0%} host {p['host_ms_excluding_wait']} ms device {p['device_ms_per_step_mean']} ms "
                      f"wall {p['wall_ms_per_step']} ms busy {p['device_busy_fraction']}")
            for p in r["passes"][:2]:
                print(f"  {name:16s} {p.get('engine') or 'async=' + str(p['async']):11s} by kind {p.get('device_by_step_kind')}")
            if "before_over_after_median" in r:
                print(f"  {name:16s} before/after median {r['before_over_after_median']} per pair {r['before_over_after_per_pair']}"
                      f"  after async=sync {r['after_async_vs_sync_identical']}/{r['compared_prompts']}"
                      f"  before=after {r['before_vs_after_identical']}")
            else:
                print(f"  {name:16s} sync/async median {r['sync_over_async_median']}  "
                      f"identical {r['async_vs_sync_identical_prompts']}/{r['compared_prompts']}")
        else:
            print(f"  {name:16s} {'ok' if e['ok'] else 'FAILED ' + e.get('error', '')[:160]} ({e['seconds']}s) {str(r)[:200] if r else ''}")


if __name__ == "__main__":
    main()
