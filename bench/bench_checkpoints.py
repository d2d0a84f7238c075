"""What shard checkpoints cost: the summarisation workload as one shard through the whole
pipeline (``run_embedded``: reading, templating, the engine, the part), checkpoints off and on
alternately (off-on, on-off, ...) on one warmed engine, so host drift hits both sides.

The rows are bench_engine's ``summ-N`` workload (the same standard-library docstrings and
long-tailed budgets, 16-512 tokens, ``ignore_eos``) written as JSONL, each row with its own
``max_tokens``. "on" is the shipped default interval unless ``--checkpoint-rows`` /
``--checkpoint-seconds`` say otherwise (a short interval shows the cost per checkpoint).
Output goes to a fresh folder per run under ``--output-url`` (local by default; an
``s3://`` URL reaches the endpoint in ``TOKENMILL_S3_ENDPOINT_URL``).

    PYTHONPATH=$PWD .venv/bin/python bench/bench_checkpoints.py summ-256 float32 --pairs 2 --out bench/published
    PYTHONPATH=$PWD .venv/bin/python bench/bench_checkpoints.py summ-256 float32 --checkpoint-rows 16 \\
        --checkpoint-seconds 0 --pairs 2 --out bench/published
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sysinfo  # noqa: E402
import workload as workload_mod  # noqa: E402

from engine import EngineConfig, LLMEngine  # noqa: E402
from engine.model_registry import DEFAULT_MODEL  # noqa: E402
from pipeline.engine_cache import warm_up  # noqa: E402
from pipeline.job_runner import run_embedded  # noqa: E402
from pipeline.plan import DEFAULT_CHECKPOINT_ROWS, DEFAULT_CHECKPOINT_SECONDS, JobPlan, PromptPlan  # noqa: E402


def summ_rows(tokenizer, count: int, seed: int = 0) -> list[dict]:
    """The rows of ``workload.build`` (same documents, same order, same budgets), as input rows."""
    rng = random.Random(seed)
    docs = workload_mod._docstrings()
    rng.shuffle(docs)
    rows = []
    for doc in docs:
        msgs = [{"role": "system", "content": workload_mod.INSTRUCTION}, {"role": "user", "content": doc}]
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        if not 100 <= len(ids) <= 1400:
            continue
        budget = int(min(512, max(16, rng.lognormvariate(4.25, 0.8))))
        rows.append({"id": f"doc-{len(rows)}", "text": doc, "sampling": {"max_tokens": budget}})
        if len(rows) == count:
            return rows
    raise RuntimeError(f"only {len(rows)} documents fit the prompt length range")


def run_once(engine: LLMEngine, settings: dict, inp: Path, output_url: str, rows: int, seconds: float) -> dict:
    plan = JobPlan(
        job_id=f"bench-ckpt-{uuid.uuid4().hex[:6]}", name="bench", kind="summarize", input_url=str(inp),
        output_url=f"{output_url.rstrip('/')}/{uuid.uuid4().hex[:8]}", id_field="id",
        prompt=PromptPlan(system=workload_mod.INSTRUCTION, user_template="{text}"),
        sampling={"temperature": 0.0, "ignore_eos": True, "max_tokens": 512}, sampling_field="sampling",
        engine_settings=settings, checkpoint_rows=rows, checkpoint_seconds=seconds,
    )
    t = time.perf_counter()
    manifest = run_embedded(plan, progress=False, engine=engine)
    wall = time.perf_counter() - t
    assert manifest["status"] == "succeeded", manifest
    out = manifest["totals"]["output_tokens"]
    return {"wall_s": wall, "output_tokens": out, "output_tok_s": out / wall, "rows": manifest["totals"]["rows"],
            "load": sysinfo.load()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workload", choices=("summ-64", "summ-256"))
    ap.add_argument("dtype", choices=("float32", "bfloat16"))
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--checkpoint-rows", type=int, default=DEFAULT_CHECKPOINT_ROWS)
    ap.add_argument("--checkpoint-seconds", type=float, default=DEFAULT_CHECKPOINT_SECONDS)
    ap.add_argument("--output-url", default=None, help="where the runs' outputs go (default: a temporary folder)")
    ap.add_argument("--out", help="directory for the JSON")
    args = ap.parse_args()
    info = sysinfo.cpu_info()
    print(sysinfo.describe(info))
    settings = {"model": args.model, "dtype": args.dtype, "max_num_batched_tokens": 2048, "kv_cache_memory_gb": 4.0}
    engine = LLMEngine(EngineConfig(**settings))
    warm_up(engine)
    with tempfile.TemporaryDirectory() as tmp:
        inp = Path(tmp) / "in"
        inp.mkdir()
        rows = summ_rows(engine.tokenizer, int(args.workload.split("-")[1]))
        (inp / "summ.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        output_url = args.output_url or str(Path(tmp) / "out")
        run_once(engine, settings, inp, output_url, 0, 0)  # warm-up
        runs = []
        for rep in range(args.pairs):
            for on in (False, True) if rep % 2 == 0 else (True, False):
                every = (args.checkpoint_rows, args.checkpoint_seconds) if on else (0, 0)
                r = run_once(engine, settings, inp, output_url, *every)
                runs.append({"pair": rep, "on": on, **r})
                print(f"  checkpoints {'on ' if on else 'off'}: {r['output_tok_s']:.1f} out tok/s "
                      f"({r['wall_s']:.1f} s)", flush=True)
    ratios = [next(r["output_tok_s"] for r in runs if r["pair"] == p and r["on"])
              / next(r["output_tok_s"] for r in runs if r["pair"] == p and not r["on"]) for p in range(args.pairs)]
    result = {"info": info, "workload": args.workload, "dtype": args.dtype, "model": args.model,
              "checkpoint_rows": args.checkpoint_rows, "checkpoint_seconds": args.checkpoint_seconds,
              "output_url": "s3" if (args.output_url or "").startswith("s3://") else "local",
              "runs": runs, "pair_ratios": ratios, "median_ratio": statistics.median(ratios)}
    print(f"{args.workload} {args.dtype}: checkpoints on/off median of pair ratios {result['median_ratio']:.3f} "
          f"({', '.join(f'{x:.3f}' for x in ratios)})")
    if args.out:
        sysinfo.write_result(args.out, f"checkpoints-{args.workload}-{args.dtype}", result)


if __name__ == "__main__":
    main()
