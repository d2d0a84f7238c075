"""The summarisation workload the benchmarks share: reproducible, real text, long-tailed outputs.

A shared instruction (system message) plus one Python standard-library docstring per
request, rendered with the model's chat template. Output budgets are long-tailed
(16 to 512 tokens) and EOS is ignored, so every engine produces exactly the same
number of output tokens.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import random
from dataclasses import dataclass

INSTRUCTION = (
    "You are a technical writer. Summarise the following Python documentation in two or three "
    "plain sentences for a newcomer. Mention what it is for and one thing to watch out for."
)
SKIP = ("antigravity", "this", "idlelib", "tkinter", "turtle", "test", "lib2to3", "ensurepip", "pydoc_data")


@dataclass
class Workload:
    prompts: list[list[int]]
    max_tokens: list[int]

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def output_tokens(self) -> int:
        return sum(self.max_tokens)


def _docstrings() -> list[str]:
    docs = []
    for mod in sorted(m.name for m in pkgutil.iter_modules() if m.module_finder.path.endswith("python3.11")):
        if mod.startswith("_") or mod in SKIP:
            continue
        try:
            module = importlib.import_module(mod)
        except Exception:
            continue
        for name, obj in sorted(vars(module).items()):
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            doc = inspect.getdoc(obj)
            if doc and len(doc) > 200 and getattr(obj, "__module__", None) == mod:
                docs.append(f"{mod}.{name}\n\n{doc}")
    return docs


def build(tokenizer, num_requests: int = 64, seed: int = 0, min_prompt: int = 100, max_prompt: int = 1400) -> Workload:
    rng = random.Random(seed)
    docs = _docstrings()
    rng.shuffle(docs)
    prompts, budgets = [], []
    for doc in docs:
        msgs = [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": doc}]
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        if not min_prompt <= len(ids) <= max_prompt:
            continue
        prompts.append(ids)
        budgets.append(int(min(512, max(16, rng.lognormvariate(4.25, 0.8)))))
        if len(prompts) == num_requests:
            break
    if len(prompts) < num_requests:
        raise RuntimeError(f"only {len(prompts)} documents fit the prompt length range")
    return Workload(prompts, budgets)
