"""Small lm-evaluation-harness tasks over local JSON files (offline: the harness's ``json``
dataset builder), one of each request type, and helpers to run them."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The tasks ship as an example (examples/harness_offline.py); the tests run the same ones.
_spec = importlib.util.spec_from_file_location(
    "tokenmill_harness_offline", Path(__file__).resolve().parents[1] / "examples" / "harness_offline.py")
_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_example)
QUESTIONS, PROMPTS, DOCUMENTS, TASKS = _example.QUESTIONS, _example.PROMPTS, _example.DOCUMENTS, _example.TASKS
write_tasks = _example.write_tasks


def evaluate(model: Any, include_path: str, model_args: dict[str, Any] | None = None,
             tasks: tuple[str, ...] = TASKS, batch_size: int = 1, **kwargs: Any) -> dict[str, Any]:
    """``simple_evaluate`` with samples logged, on the given tasks only."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(
        model=model, model_args=model_args, tasks=list(tasks), task_manager=TaskManager(include_path=include_path, include_defaults=False),
        log_samples=True, batch_size=batch_size, device="cpu", random_seed=0, numpy_random_seed=0, torch_random_seed=0,
        fewshot_random_seed=0, **kwargs)


def responses(result: dict[str, Any], task: str) -> list[list[Any]]:
    """Per sample (in doc order), the model's raw answers: (logprob, is_greedy) pairs,
    rolling log-likelihoods or generated strings."""
    samples = sorted(result["samples"][task], key=lambda s: s["doc_id"])
    return [[r[0] if isinstance(r, list) and len(r) == 1 else r for r in s["resps"]] for s in samples]


def metrics(result: dict[str, Any], task: str) -> dict[str, Any]:
    return {k: v for k, v in result["results"][task].items() if k != "alias"}
