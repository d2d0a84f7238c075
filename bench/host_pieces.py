"""Two host costs that sit outside a step's parts (issue 26), timed on their own.

* ``head``: until the first ``schedule()`` of the GPU job (``bench/gpu/summ-1024.json``, ids folded
  into the stub's vocabulary) returns, with every request added first and with the requests fed
  as admission reaches them: what a GPU idles through before ``LLM.generate`` launches its first
  step (the pipeline adds rows between steps).
* ``boundary``: one ``BlockManager.allocate_slots`` call for a decoding sequence at a block
  boundary (a new block, the filled block hashed and published), over ``--size`` sequences of
  20-200 prompt tokens; the scheduler makes one such call per sequence every ``block_size`` steps.

    PYTHONPATH=$PWD .venv/bin/python bench/host_pieces.py --out bench/published
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import host_overhead  # noqa: E402
import sysinfo  # noqa: E402
import torch  # noqa: E402

from engine.block_manager import BlockManager  # noqa: E402
from engine.host import objects_frozen_during_call  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.sequence import Sequence  # noqa: E402
from engine.stopping import StopConditions  # noqa: E402

WORKLOAD = Path(__file__).resolve().parent / "gpu" / "summ-1024.json"


def head(rounds: int) -> dict:
    """Until the first step is scheduled, both ways in alternating order each round: every
    request added first (``LLM.generate`` before 2026-11-27), or fed as admission reaches it
    (``LLMEngine.feed_requests``, what ``generate`` does now)."""
    wl = json.loads(WORKLOAD.read_text())
    prompts = [[t % host_overhead.VOCAB for t in p] for p in wl["prompts"]]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = host_overhead.build_model_dir(Path(tmp))
        engine, _ = host_overhead.make_engine(model_dir, 1024, 0, "on")
    engine.scheduler.max_num_seqs = 512  # the GPU job's tuned setting (gpu_async.py)
    times: dict[str, list[float]] = {"queued_first": [], "fed": []}
    admitted = []
    for r in range(rounds):
        for mode in (("queued_first", "fed") if r % 2 == 0 else ("fed", "queued_first")):
            params = [SamplingParams(max_tokens=b, temperature=0, ignore_eos=True) for b in wl["max_tokens"]]
            requests = [(f"{r}-{mode}-{i}", p, sp) for i, (p, sp) in enumerate(zip(prompts, params, strict=True))]
            engine.block_manager.reset_prefix_cache()
            gc.collect()
            with objects_frozen_during_call():
                t0 = time.perf_counter()
                if mode == "fed":
                    engine.feed_requests(requests, lambda *refused: None)
                else:
                    for request_id, prompt, p in requests:
                        engine.add_request(request_id, prompt, p)
                batch = engine.scheduler.schedule()
                times[mode].append((time.perf_counter() - t0) * 1e3)
            admitted.append(len(batch))
            engine.abort_all()
    n = len(prompts)
    return {"requests": n, "mean_prompt_tokens": round(statistics.mean(map(len, prompts)), 1),
            "first_step_sequences": sorted(set(admitted)),
            "until_first_schedule_ms": {k: [round(x, 2) for x in v] for k, v in times.items()},
            "median_ms": {k: round(statistics.median(v), 2) for k, v in times.items()}}


def boundary(size: int, steps: int) -> dict:
    rng = random.Random(0)
    params = SamplingParams(max_tokens=10**6, temperature=0, ignore_eos=True)
    stop, bm = StopConditions(), BlockManager(size * 40, 16, True)
    seqs = []
    for i in range(size):
        seq = Sequence(str(i), [rng.randrange(3, 500) for _ in range(rng.randrange(20, 200))], params)
        stop.attach(seq)
        bm.admit(seq, [], seq.num_tokens)
        seq.num_computed_tokens = seq.num_tokens
        seqs.append(seq)
    calls, seconds = 0, 0.0
    for _ in range(steps):  # each step: every sequence decodes one token, as the scheduler allocates
        for seq in seqs:
            seq.token_ids.append(rng.randrange(3, 500))
            if seq.num_computed_tokens + 1 > seq.slots_ready_until:
                t = time.perf_counter()
                bm.allocate_slots(seq, 1)
                seconds += time.perf_counter() - t
                calls += 1
            seq.num_computed_tokens += 1
    return {"size": size, "steps": steps, "calls": calls, "us_per_call": round(seconds / calls * 1e6, 2),
            "calls_per_step": round(calls / steps, 1), "us_per_step": round(seconds / steps * 1e6, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    info = sysinfo.cpu_info()
    print(sysinfo.describe(info), flush=True)
    result = {"bench": "host_pieces", "command": " ".join(sys.argv), "system": info,
              "head": head(args.rounds), "boundary": boundary(args.size, args.steps)}
    print(json.dumps({k: result[k] for k in ("head", "boundary")}, indent=1))
    if args.out:
        sysinfo.write_result(args.out, "host-pieces", result)


if __name__ == "__main__":
    main()
