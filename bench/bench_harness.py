"""lm-evaluation-harness throughput on a multiple-choice task with shared few-shot contexts:
the ``tokenmill`` model against the harness's own ``hf`` model, one run each, same task.

The task is written to a temporary folder (the harness's ``json`` builder over a local file,
offline): ``--questions`` arithmetic questions with 4 choices behind ``--shots`` worked
examples (the same examples for every question, as ``first_n`` few-shot sampling gives), so
every request shares the few-shot block and each question's 4 requests share its context.
Both models get the same requests; the script checks that they report the same accuracy and
log-likelihoods within 1e-4 before it writes ``bench/published/harness-mc-*.json``.

    .venv/bin/python bench/bench_harness.py --questions 60 --shots 5 --hf-batch-size 16
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.sysinfo import cpu_info, load, write_result  # noqa: E402


def write_task(root: Path, questions: int, shots: int) -> str:
    rng = random.Random(0)
    rows = []
    for _ in range(questions + shots):
        a, b = rng.randint(2, 60), rng.randint(2, 60)
        right = a + b
        wrong = rng.sample([x for x in range(right - 9, right + 10) if x != right and x > 0], 3)
        choices = [str(x) for x in [right, *wrong]]
        rng.shuffle(choices)
        rows.append({"question": f"What is {a} plus {b}?", "choices": choices, "answer": choices.index(str(right))})
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:shots]))
    (root / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[shots:]))
    (root / "bench_mc.yaml").write_text(f"""task: bench_mc
dataset_path: json
dataset_kwargs:
  data_files:
    train: {root / 'train.jsonl'}
    test: {root / 'test.jsonl'}
output_type: multiple_choice
training_split: train
test_split: test
fewshot_split: train
num_fewshot: {shots}
fewshot_config:
  sampler: first_n
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
metadata:
  version: 1.0
""")
    return str(root)


def run(model, model_args, include_path: str, batch_size: int) -> tuple[dict, float]:
    import lm_eval
    from lm_eval.tasks import TaskManager

    started = time.perf_counter()
    result = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=["bench_mc"], log_samples=True,
                                     task_manager=TaskManager(include_path=include_path, include_defaults=False),
                                     batch_size=batch_size, device="cpu", random_seed=0, numpy_random_seed=0,
                                     torch_random_seed=0, fewshot_random_seed=0)
    return result, time.perf_counter() - started


def per_request(result: dict) -> list[tuple[float, bool]]:
    samples = sorted(result["samples"]["bench_mc"], key=lambda s: s["doc_id"])
    return [(float(r[0][0]), bool(r[0][1])) for s in samples for r in s["resps"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="name or HF directory (default: the default model)")
    ap.add_argument("--questions", type=int, default=60)
    ap.add_argument("--shots", type=int, default=5)
    ap.add_argument("--hf-batch-size", type=int, default=16)
    ap.add_argument("--out", default=str(REPO / "bench" / "published"))
    args = ap.parse_args()

    import torch

    from engine.model_registry import DEFAULT_MODEL, resolve_model
    from harness.model import TokenmillLM

    model_dir = str(resolve_model(args.model or DEFAULT_MODEL))
    with tempfile.TemporaryDirectory() as tmp:
        include_path = write_task(Path(tmp), args.questions, args.shots)
        load_started = time.perf_counter()
        lm = TokenmillLM(model=model_dir, dtype="float32", progress=False)
        tm_load = time.perf_counter() - load_started
        ours, tm_seconds = run(lm, None, include_path, 1)
        from lm_eval.models.huggingface import HFLM

        load_started = time.perf_counter()
        hf = HFLM(pretrained=model_dir, dtype="float32", device="cpu", batch_size=args.hf_batch_size)
        hf_load = time.perf_counter() - load_started
        theirs, hf_seconds = run(hf, None, include_path, args.hf_batch_size)
    a, b = per_request(ours), per_request(theirs)
    worst = max(abs(x[0] - y[0]) for x, y in zip(a, b, strict=True))
    same_greedy = all(x[1] == y[1] for x, y in zip(a, b, strict=True))
    acc = {k: ours["results"]["bench_mc"][k] for k in ("acc,none", "acc_norm,none")}
    acc_hf = {k: theirs["results"]["bench_mc"][k] for k in ("acc,none", "acc_norm,none")}
    if worst > 1e-4 or not same_greedy or acc != acc_hf:
        raise SystemExit(f"the models disagree: max |dLL| {worst}, is_greedy same {same_greedy}, {acc} vs {acc_hf}")
    run_stats = lm.runs[-1]
    result = {
        "what": "lm-evaluation-harness multiple choice, shared few-shot contexts: tokenmill model vs hf model",
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "model": model_dir, "dtype": "float32", "device": "cpu", "torch_threads": torch.get_num_threads(),
        "questions": args.questions, "shots": args.shots, "requests": len(a),
        "tokenmill": {"seconds": round(tm_seconds, 2), "requests_per_s": round(len(a) / tm_seconds, 2),
                      "engine_load_seconds": round(tm_load, 2), "engine_call_seconds": round(run_stats.seconds, 2),
                      "prompt_tokens_computed": run_stats.engine["prompt_tokens_computed"],
                      "prefix_cache_hit_tokens": run_stats.engine["prefix_cache_hit_tokens"],
                      "prefix_cache_query_tokens": run_stats.engine["prefix_cache_query_tokens"]},
        "hf": {"seconds": round(hf_seconds, 2), "requests_per_s": round(len(a) / hf_seconds, 2),
               "batch_size": args.hf_batch_size, "model_load_seconds": round(hf_load, 2)},
        "speedup": round(hf_seconds / tm_seconds, 2),
        "agreement": {"max_abs_loglikelihood_diff": worst, "is_greedy_identical": same_greedy, "acc": acc},
        "machine": {**cpu_info(), "load": load()},
    }
    print(json.dumps({k: result[k] for k in ("tokenmill", "hf", "speedup", "agreement")}, indent=1))
    write_result(args.out, "harness-mc", result)


if __name__ == "__main__":
    main()
