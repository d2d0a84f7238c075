"""Host work of one engine step, with the model taken out (issue 26, part 1).

The real engine (scheduler, block manager, model runner input building, sampler, output
processing) runs around a stub model whose forward costs nothing; with ``--device-ms D`` the
stub acts as an asynchronous device instead: each forward occupies a simulated device for D ms,
and reading the step's sampled tokens waits for it, as a CUDA stream would. Each part of a step is
timed by wrapping the engine's own methods, so the same script measures any tree.

    PYTHONPATH=$PWD .venv/bin/python bench/host_overhead.py --out bench/published
    PYTHONPATH=$PWD .venv/bin/python bench/host_overhead.py --sizes 256 --device-ms 2 --async-modes off on

Workloads at each number of running sequences: ``decode`` (every sequence decodes) and ``mixed``
(new 200-token prompts keep arriving, so most steps carry a prefill chunk), each with greedy and
with seeded sampling (temperature 0.8, top-p 0.95, top-k 50), prefix caching on.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sysinfo  # noqa: E402
import torch  # noqa: E402

VOCAB = 512
ONE_HOT_LOGITS = False  # --one-hot-logits: the stub's logits before 2026-11-26 (ties everywhere)
PARTS = (  # (label, owner attribute on the engine or None for the engine itself, method)
    ("schedule", "scheduler", "schedule"),
    ("prepare", "runner", "prepare"),
    ("sample", None, "_sample"),
    ("update", "scheduler", "update"),
    ("outputs", "output_processor", "build"),
    # Work a GPU does on its device, timed where it runs here (inside the parts above or "other"):
    ("model", "runner", "_forward"),  # the stub's logits
    ("sampler", "runner", "sample_tokens"),  # argmax / draws (its host side: settings, seeds)
)
NESTED = ("model", "sampler")  # not subtracted again for "other"


def build_model_dir(root: Path) -> Path:
    """A 1-layer, 64-wide Llama with a 512-token vocabulary: the model costs almost nothing."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=4096,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(cfg).save_pretrained(root)
    return root


class SimulatedDevice:
    """A device queue on a clock: work is enqueued at once and finishes ``device_ms`` after the
    later of its launch and the previous work's end; ``synchronize`` waits for the end."""

    def __init__(self, device_ms: float) -> None:
        self.seconds = device_ms / 1000
        self.busy_until = 0.0
        self.busy_total = 0.0

    def launch(self) -> None:
        start = max(time.perf_counter(), self.busy_until)
        self.busy_until = start + self.seconds
        self.busy_total += self.seconds

    def synchronize(self, until: float | None = None) -> None:
        end = self.busy_until if until is None else until
        while time.perf_counter() < end:
            pass

    def record_event(self) -> Marker:
        return Marker(self, self.busy_until)


class Marker:
    """What a CUDA event is to a stream: the end of the work queued when it was recorded."""

    def __init__(self, device: SimulatedDevice, at: float) -> None:
        self.device, self.at = device, at

    def synchronize(self) -> None:
        self.device.synchronize(self.at)


class StubModel(torch.nn.Module):
    """Stands in for the model: logits that pick a token from the input id (so tokens vary) and
    cost next to nothing. Keeps the real model's config and attention layers for the runner."""

    def __init__(self, real: torch.nn.Module, device: SimulatedDevice | None) -> None:
        super().__init__()
        self.real = real
        self.config = real.config
        self.head_dim = real.head_dim
        self.sim = device
        self.sync_in_forward = False
        self.noise: torch.Tensor | None = None

    def attention_layers(self):
        return self.real.attention_layers()

    def forward(self, input_ids, positions, meta, logits_indices):
        rows = input_ids[logits_indices]
        n = rows.shape[0]
        if ONE_HOT_LOGITS:  # every other token tied at zero: top-k keeps the whole vocabulary
            logits = torch.zeros(n, VOCAB)
        else:  # a fixed spread of logits, as a model's, with the greedy token well ahead
            if self.noise is None or self.noise.shape[0] < n:  # once: rows are the same at any size
                self.noise = torch.randn(max(n, 2048), VOCAB, generator=torch.Generator().manual_seed(0)) * 2
            logits = self.noise[:n].clone()
        logits[torch.arange(n), (rows * 7 + positions[logits_indices] + 3) % VOCAB] += 6.0
        if self.sim is not None:
            self.sim.launch()
            if self.sync_in_forward:
                self.sim.synchronize()
        return logits


class PartTimer:
    """Wraps the engine's methods; accumulates seconds per part while ``on``."""

    def __init__(self, engine) -> None:
        self.totals: dict[str, float] = {label: 0.0 for label, _, _ in PARTS}
        self.on = False
        for label, owner_name, method in PARTS:
            owner = engine if owner_name is None else getattr(engine, owner_name)
            if hasattr(owner, method):
                setattr(owner, method, self._wrap(label, getattr(owner, method)))

    def _wrap(self, label, fn):
        def timed(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.totals[label] += time.perf_counter() - t
        return timed


def make_engine(model_dir: Path, size: int, device_ms: float, async_mode: str | None):
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    kwargs = dict(model=str(model_dir), max_num_seqs=size, max_num_batched_tokens=max(2048, size),
                  num_kv_blocks=size * 40, enable_prefix_caching=True, num_threads=1)
    if async_mode is not None:
        kwargs["async_scheduling"] = async_mode == "on"
    engine = LLMEngine(EngineConfig(**kwargs))
    sim = SimulatedDevice(device_ms) if device_ms > 0 else None
    engine.runner.model = StubModel(engine.runner.model, sim)
    if sim is not None and hasattr(engine.runner, "record_event"):
        engine.runner.record_event = sim.record_event  # a step's tokens are ready when its work is done
    elif sim is not None:
        engine.runner.model.sync_in_forward = True  # an engine that reads tokens right after the forward
    return engine, sim


def run_case(model_dir: Path, size: int, workload: str, sampling: str, steps: int, device_ms: float,
             async_mode: str | None, profile: bool, decode_prompt: int = 32) -> dict:
    from engine.sampling_params import SamplingParams

    engine, sim = make_engine(model_dir, size, device_ms, async_mode)
    try:  # as a worker does once its engine is built (pipeline/engine_cache.py); trees before it did not
        from engine.host import freeze_startup_objects
    except ImportError:
        pass
    else:
        freeze_startup_objects()
    gen = torch.Generator().manual_seed(size)
    counter = iter(range(10**9))

    def params(max_tokens: int, i: int) -> SamplingParams:
        if sampling == "greedy":
            return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        return SamplingParams(max_tokens=max_tokens, temperature=0.8, top_p=0.95, top_k=50, seed=i,
                              ignore_eos=True)

    def add(prompt_len: int, max_tokens: int) -> None:
        i = next(counter)
        ids = torch.randint(3, VOCAB, (prompt_len,), generator=gen).tolist()
        engine.add_request(f"r{i}", ids, params(max_tokens, i))

    if workload == "decode":
        for _ in range(size):
            add(decode_prompt, 3000)
        while len(engine.scheduler.running) < size or engine.scheduler.waiting:
            engine.step()
    else:  # mixed: sequences of 100-300 tokens, a queue of 200-token prompts behind them
        for _ in range(size):
            add(200, int(torch.randint(100, 300, (1,), generator=gen)))
        for _ in range(400):
            if len(engine.scheduler.running) >= 0.9 * size:
                break
            engine.step()
    timer = PartTimer(engine)
    walls, running = [], []
    prof = cProfile.Profile() if profile else None
    busy0 = sim.busy_total if sim else 0.0
    timer.on = True
    for _ in range(steps):
        if workload == "mixed":
            while len(engine.scheduler.waiting) < size // 4:
                add(200, int(torch.randint(100, 300, (1,), generator=gen)))
        t = time.perf_counter()
        if prof:
            prof.enable()
        engine.step()
        if prof:
            prof.disable()
        walls.append(time.perf_counter() - t)
        running.append(len(engine.scheduler.running))
    timer.on = False
    drain = getattr(engine, "drain", None)  # an async engine hands its last step back here
    if drain is not None:
        drain()
    us = {k: round(v / steps * 1e6, 1) for k, v in timer.totals.items()}
    wall_us = statistics.mean(walls) * 1e6
    result = {
        "size": size, "workload": workload, "sampling": sampling, "steps": steps, "device_ms": device_ms,
        "async": async_mode, "wall_us_per_step": round(wall_us, 1),
        "wall_us_median": round(statistics.median(walls) * 1e6, 1),
        "parts_us_per_step": us,
        "other_us_per_step": round(wall_us - sum(v for k, v in us.items() if k not in NESTED), 1),
        # what stays on the host when a GPU runs the model and the sampler's arithmetic
        "host_us_excluding_model_and_sampler": round(wall_us - us["model"] - us["sampler"], 1),
        "mean_running": round(statistics.mean(running), 1),
        "device_busy_fraction": round((sim.busy_total - busy0) / sum(walls), 3) if sim else None,
    }
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
        result["profile_tottime"] = s.getvalue().splitlines()[:40]
    return result


def serve(model_dir: Path, args: argparse.Namespace) -> None:
    """One case per stdin line ({"size", "workload", "sampling", "async"}), one result line back:
    two trees' servers can then alternate case by case instead of whole matrices."""
    print("ready", flush=True)
    for line in sys.stdin:
        case = json.loads(line)
        r = run_case(model_dir, case["size"], case["workload"], case["sampling"], args.steps, args.device_ms,
                     case.get("async"), False, args.decode_prompt)
        print("result " + json.dumps(r), flush=True)


def main() -> None:
    global VOCAB, ONE_HOT_LOGITS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 512, 1024])
    ap.add_argument("--workloads", nargs="+", default=["decode", "mixed"])
    ap.add_argument("--samplings", nargs="+", default=["greedy", "seeded"])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--device-ms", type=float, default=0.0, help="simulated device time per step (0: none)")
    ap.add_argument("--async-modes", nargs="+", default=None, help="off/on: EngineConfig.async_scheduling")
    ap.add_argument("--profile", action="store_true", help="cProfile each case (slows it)")
    ap.add_argument("--decode-prompt", type=int, default=32, help="prompt tokens of the decode workload's sequences (the KV pool holds 40 blocks a sequence)")
    ap.add_argument("--vocab", type=int, default=VOCAB, help="the stub model's vocabulary (sampling cost)")
    ap.add_argument("--one-hot-logits", action="store_true",
                    help="the stub's old logits: one 1.0 per row, the rest tied at 0 (sampling keeps them all)")
    ap.add_argument("--serve", action="store_true",
                    help="read cases as JSON lines on stdin, answer each with one JSON line (host_overhead_ab.py --interleave)")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    VOCAB = args.vocab
    ONE_HOT_LOGITS = args.one_hot_logits
    torch.set_num_threads(1)
    info = sysinfo.cpu_info()
    print(sysinfo.describe(info))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model_dir(Path(tmp))
        if args.serve:
            serve(model_dir, args)
            return
        for size in args.sizes:
            for workload in args.workloads:
                for sampling in args.samplings:
                    for mode in args.async_modes or [None]:
                        r = run_case(model_dir, size, workload, sampling, args.steps, args.device_ms, mode,
                                     args.profile, args.decode_prompt)
                        rows.append(r)
                        parts = " ".join(f"{k}={v:.0f}" for k, v in r["parts_us_per_step"].items())
                        print(f"{size:5d} {workload:6s} {sampling:6s} async={mode} wall={r['wall_us_per_step']:8.0f} us"
                              f"  {parts} other={r['other_us_per_step']:.0f}  running={r['mean_running']}"
                              f"  host-without-model-and-sampler={r['host_us_excluding_model_and_sampler']:.0f}"
                              + (f" busy={r['device_busy_fraction']}" if r["device_busy_fraction"] else ""))
    result = {"bench": "host_overhead", "label": args.label, "command": " ".join(sys.argv), "system": info,
              "results": rows}
    if args.out:
        sysinfo.write_result(args.out, "host-overhead" + (f"-{args.label}" if args.label else ""), result)


if __name__ == "__main__":
    main()
