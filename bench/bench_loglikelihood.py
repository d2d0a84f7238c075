"""8-choice log-likelihood evaluation, prefix sharing on vs off, in one run.

Each row's 8 choices are 8 requests with the same context (few-shot examples + the
question, in the chat template); with prefix sharing the context's full KV blocks are
computed once per row (and the few-shot blocks once for the whole set), without it every
choice recomputes them. Rows are the 24 questions of ``examples/data/mmlu_style.jsonl``,
each with its 4 choices plus 4 from the next questions (gold stays the same), behind
``--shots`` worked examples. Both modes run the same job through ``run_embedded`` on a
fresh, warmed engine; the per-choice scores must agree between the modes.

    .venv/bin/python bench/bench_loglikelihood.py --shots 3 --repeats 2 --threads 2
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from connectors import read_parts  # noqa: E402
from engine import EngineConfig, LLMEngine  # noqa: E402
from engine.model_registry import DEFAULT_MODEL  # noqa: E402
from jobs import JobSpec  # noqa: E402
from pipeline.engine_cache import warm_up  # noqa: E402
from pipeline.job_runner import run_embedded  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
LETTERS = "ABCDEFGH"


def write_rows(path: Path) -> list[dict]:
    base = [json.loads(line) for line in (REPO / "examples/data/mmlu_style.jsonl").read_text().splitlines()]
    rows = []
    for i, row in enumerate(base):
        choices = list(row["choices"])
        for step in range(1, len(base)):  # distractors: the next questions' choices, no repeats
            choices += [c for c in base[(i + step) % len(base)]["choices"] if c not in choices][: 8 - len(choices)]
            if len(choices) == 8:
                break
        rows.append({**row, "choices": choices})
    assert all(len(r["choices"]) == 8 for r in rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def spec_for(data: Path, out: Path, rows: list[dict], shots: int, args) -> JobSpec:
    few_shot = [{"user": f"Question: {r['question']}\nAnswer:", "assistant": r["choices"][r["answer"]]}
                for r in rows[-shots:]] if shots else []
    return JobSpec.from_dict({
        "name": "bench-ll8", "kind": "evaluate",
        "input": {"url": str(data), "id_field": "id", "text_field": "question"},
        "output": {"url": str(out)},
        "model": {"name": args.model, "max_num_seqs": args.max_num_seqs,
                  "max_num_batched_tokens": args.max_batched_tokens, "num_threads": args.threads},
        "prompt": {"system": "Answer the question.", "template": "Question: {question}\nAnswer:",
                   "few_shot": few_shot},
        "evaluate": {"method": "loglikelihood"},
    })


def run_mode(prefix: bool, spec: JobSpec, out: Path) -> tuple[dict, list]:
    plan = spec.to_plan(f"bench-ll8-{'on' if prefix else 'off'}")
    plan.output_url = str(out)
    plan.engine_settings = {**plan.engine_settings, "enable_prefix_caching": prefix}
    engine = LLMEngine(EngineConfig(**plan.engine_settings))
    warm_up(engine)
    t = time.perf_counter()
    manifest = run_embedded(plan, progress=False, engine=engine)
    wall = time.perf_counter() - t
    stats, rows = manifest["engine_stats"], manifest["totals"]["rows"]
    scores = read_parts(str(out)).column("choice_logprobs").to_pylist()
    del engine
    gc.collect()
    return {
        "prefix_caching": prefix, "rows": rows, "choices": rows * 8, "wall_s": round(wall, 2),
        "rows_per_s": round(rows / wall, 3), "choices_per_s": round(rows * 8 / wall, 2),
        "prompt_tokens": manifest["totals"]["prompt_tokens"],
        "prompt_tokens_computed": stats["prompt_tokens_computed"],
        "prefix_cache_hit_tokens": stats["prefix_cache_hit_tokens"],
        "prompt_tokens_per_s_computed": round(stats["prompt_tokens_computed"] / wall, 1),
        "row_errors": manifest["totals"]["errors"], "acc": manifest["summary"]["acc"],
        "acc_norm": manifest["summary"]["acc_norm"], "steps": stats["steps"],
    }, scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--shots", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2, help="on/off pairs, the order alternating")
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-batched-tokens", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None, help="JSON path (default bench/published/loglikelihood-8choice-DATE.json)")
    args = ap.parse_args()
    runs, max_diff = [], 0.0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows = write_rows(root / "rows.jsonl")
        spec = spec_for(root / "rows.jsonl", root / "out", rows, args.shots, args)
        for r in range(args.repeats):
            order = (True, False) if r % 2 == 0 else (False, True)
            pair = {}
            for prefix in order:
                result, scores = run_mode(prefix, spec, root / f"out-{r}-{prefix}")
                result["repeat"] = r
                runs.append(result)
                pair[prefix] = scores
                print(json.dumps(result), flush=True)
            max_diff = max(max_diff, max(abs(a - b) for x, y in zip(pair[True], pair[False], strict=True)
                                         for a, b in zip(x, y, strict=True)))
    on = statistics.median(r["choices_per_s"] for r in runs if r["prefix_caching"])
    off = statistics.median(r["choices_per_s"] for r in runs if not r["prefix_caching"])
    report = {
        "bench": "loglikelihood-8choice", "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "model": args.model, "shots": args.shots, "rows": runs[0]["rows"], "choices_per_row": 8,
        "runs": runs, "median_choices_per_s": {"on": on, "off": off},
        "speedup_on_over_off": round(on / off, 2),
        "max_abs_score_diff_on_vs_off": max_diff,
    }
    out = Path(args.out or REPO / f"bench/published/loglikelihood-8choice-{datetime.date.today()}.json")
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()
