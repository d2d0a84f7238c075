"""Three lm-evaluation-harness tasks that run offline, over local JSON files (the harness's ``json``
dataset builder): a 2-shot multiple choice (``tm_mc``, log-likelihood), a generation (``tm_gen``)
and a rolling log-likelihood (``tm_roll``), one of each request type. A team's own task is the
same YAML over its own files.

    python examples/harness_offline.py /tmp/tm_tasks       # writes the YAML and data, prints the command
    HF_DATASETS_OFFLINE=1 tokenmill lm-eval --model tokenmill \
        --model_args model=smollm2-135m-instruct,dtype=float32 \
        --tasks tm_mc,tm_gen,tm_roll --include_path /tmp/tm_tasks --device cpu

The test suite evaluates these same tasks (tests/harness_support.py loads this file).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

QUESTIONS = [
    ("What colour is the sky on a clear day?", ["green", "blue", "red", "purple"], 1),
    ("How many legs does a spider have?", ["six", "four", "eight", "ten"], 2),
    ("Which animal says moo?", ["a cow", "a cat", "a dog", "a duck"], 0),
    ("What do bees make?", ["milk", "silk", "wool", "honey"], 3),
    ("Which is the largest planet?", ["Mars", "Jupiter", "Venus", "Mercury"], 1),
    ("What is frozen water called?", ["ice", "steam", "sand", "glass"], 0),
]
PROMPTS = [
    ("The capital of France is", " Paris"),
    ("One, two, three, four,", " five"),
    ("Monday, Tuesday, Wednesday,", " Thursday"),
    ("The opposite of hot is", " cold"),
]
DOCUMENTS = [
    "The river flowed quietly past the old mill, where children once played on summer afternoons.",
    "Stars are born in clouds of gas and dust. Gravity pulls the material together until the core is hot "
    "enough for nuclear fusion to begin. " * 6,
    "A short note.",
]
TASKS = ("tm_mc", "tm_gen", "tm_roll")


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def write_tasks(root: Path) -> str:
    """The three tasks' YAML and data under ``root``; returns the ``include_path``."""
    root.mkdir(parents=True, exist_ok=True)
    mc = [{"question": q, "choices": c, "answer": a} for q, c, a in QUESTIONS]
    files = {
        "mc_train": _jsonl(root / "mc_train.jsonl", mc[:2]),
        "mc_test": _jsonl(root / "mc_test.jsonl", mc[2:]),
        "gen": _jsonl(root / "gen.jsonl", [{"prompt": p, "target": t} for p, t in PROMPTS]),
        "roll": _jsonl(root / "roll.jsonl", [{"text": d} for d in DOCUMENTS]),
    }
    (root / "tm_mc.yaml").write_text(f"""task: tm_mc
dataset_path: json
dataset_kwargs:
  data_files:
    train: {files['mc_train']}
    test: {files['mc_test']}
output_type: multiple_choice
training_split: train
test_split: test
fewshot_split: train
num_fewshot: 2
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
    (root / "tm_gen.yaml").write_text(f"""task: tm_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {files['gen']}
output_type: generate_until
test_split: test
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{target}}}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
metadata:
  version: 1.0
""")
    (root / "tm_roll.yaml").write_text(f"""task: tm_roll
dataset_path: json
dataset_kwargs:
  data_files:
    test: {files['roll']}
output_type: loglikelihood_rolling
test_split: test
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
metadata:
  version: 1.0
""")
    return str(root)


def main(argv: list[str]) -> None:
    root = Path(argv[0] if argv else "harness_tasks").resolve()
    include_path = write_tasks(root)
    print(f"HF_DATASETS_OFFLINE=1 tokenmill lm-eval --model tokenmill --model_args "
          f"model=smollm2-135m-instruct,dtype=float32 --tasks {','.join(TASKS)} --include_path {include_path} "
          "--device cpu")


if __name__ == "__main__":
    main(sys.argv[1:])
