"""The summarisation workload the benchmarks share: reproducible, real text, long-tailed outputs.

A shared instruction (system message) plus one Python standard-library docstring per
request, rendered with the model's chat template. Output budgets are long-tailed
(16 to 512 tokens) and EOS is ignored, so every engine produces exactly the same
number of output tokens.
"""

from __future__ import annotations

import functools
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
    shared_prefix: int = 0  # tokens every prompt starts with (the few-shot examples)

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


FEWSHOT_HEADER = "Each passage below comes from the Python standard library documentation. Name the function or class it documents.\n\n"


def _passage(tokenizer, doc: str, max_tokens: int) -> tuple[str, list[int]]:
    """The docstring body (name line dropped) cut to ``max_tokens`` tokens."""
    name, _, body = doc.partition("\n\n")
    ids = tokenizer.encode(body, add_special_tokens=False)[:max_tokens]
    return name, ids


def build_fewshot(tokenizer, num_questions: int = 48, shots: int = 8, seed: int = 0) -> Workload:
    """An 8-shot evaluation set: every prompt is the same header and ``shots`` worked examples
    (about 700 tokens), then one question, 750-850 tokens in all; answers are 8-32 tokens.

    Prompts are concatenated token ids, so the shared part is token-identical in every prompt
    (what a prefix cache can serve), whatever the tokenizer would merge at the seams."""
    rng = random.Random(seed + 1)
    docs = _docstrings()
    rng.shuffle(docs)
    enc = functools.partial(tokenizer.encode, add_special_tokens=False)
    prefix = enc(FEWSHOT_HEADER)
    for doc in docs[:shots]:
        name, ids = _passage(tokenizer, doc, 78)
        prefix += enc("Passage: ") + ids + enc(f"\nAnswer: {name}\n\n")
    prompts, budgets = [], []
    for doc in docs[shots:]:
        head, tail = prefix + enc("Passage: "), enc("\nAnswer:")
        want = rng.randint(750, 850) - len(head) - len(tail)
        name, ids = _passage(tokenizer, doc, want)
        if len(ids) < want:
            continue
        prompts.append(head + ids + tail)
        budgets.append(rng.randint(8, 32))
        if len(prompts) == num_questions:
            break
    return Workload(prompts, budgets, shared_prefix=len(prefix))
