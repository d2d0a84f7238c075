"""Structured output: what a request constrains its text to (``StructuredOutput``, in the
shape of vLLM's ``StructuredOutputsParams``) and the xgrammar backend that enforces it."""

from __future__ import annotations

import atexit
import json
import os
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from engine.constraint_size import check_expansion

FORMS = ("json", "regex", "choice", "grammar", "json_object")
MAX_CONSTRAINT_CHARS = 100_000  # a schema, regex, grammar or the choices, as text
COMPILE_TIMEOUT_S = 5.0  # a constraint that takes longer is its request's error, not a stalled engine
MAX_ABANDONED = 2  # timed-out compiles still running; while there are this many, new ones are refused
MAX_CACHED = 256  # compiled grammars kept (least recently used dropped first)


@dataclass
class StructuredOutput:
    """Exactly one of: ``json`` (a JSON schema, as a dict or a JSON string), ``regex``,
    ``choice`` (a list of strings, the output is one of them), ``grammar`` (EBNF text in
    xgrammar's GBNF dialect) or ``json_object=True`` (any JSON object, OpenAI's json_object mode)."""

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool = False

    def __post_init__(self) -> None:
        if self.choice is not None and not isinstance(self.choice, str):
            self.choice = list(self.choice)
        self.validate()

    @property
    def form(self) -> str:
        return next(k for k in FORMS if getattr(self, k) not in (None, False))

    def validate(self) -> None:
        given = [k for k in FORMS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(
                f"structured_output needs exactly one of json, regex, choice, grammar, json_object; got "
                f"{', '.join(given) if given else 'none'}"
            )
        if self.json is not None:
            if isinstance(self.json, str):
                try:
                    json.loads(self.json)
                except ValueError as e:
                    raise ValueError(f"structured_output.json is not valid JSON: {e}") from None
            elif not isinstance(self.json, dict):
                raise ValueError(f"structured_output.json must be a dict or a JSON string, got {self.json!r}")
        if self.regex is not None and (not isinstance(self.regex, str) or not self.regex):
            raise ValueError(f"structured_output.regex must be a non-empty string, got {self.regex!r}")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise ValueError(f"structured_output.grammar must be a non-empty string, got {self.grammar!r}")
        if self.choice is not None and (
            isinstance(self.choice, str) or not self.choice
            or any(not isinstance(c, str) or not c for c in self.choice)
        ):
            raise ValueError(f"structured_output.choice must be a non-empty list of non-empty strings, got {self.choice!r}")
        if not isinstance(self.json_object, bool):
            raise ValueError(f"structured_output.json_object must be a bool, got {self.json_object!r}")
        form, text = self.key()
        if len(text) > MAX_CONSTRAINT_CHARS:
            raise ValueError(f"structured_output.{form} is {len(text)} characters; the limit is {MAX_CONSTRAINT_CHARS}")
        check_expansion(form, text)  # a small text can still unroll into a grammar that compiles for minutes

    def key(self) -> tuple[str, str]:
        """A hashable identity of the constraint: equal keys compile to the same grammar."""
        form = self.form
        value = getattr(self, form)
        if form == "json":
            text = json.dumps(json.loads(value) if isinstance(value, str) else value)  # order matters
        elif form == "choice":
            text = json.dumps(value)
        else:
            text = str(value)
        return form, text

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StructuredOutput:
        if not isinstance(data, dict):
            raise ValueError(f"structured_output must be a dict or StructuredOutput, got {data!r}")
        unknown = sorted(set(data) - set(FORMS))
        if unknown:
            raise ValueError(f"unknown structured_output field(s): {', '.join(unknown)}")
        return cls(**data)


_running: set[threading.Thread] = set()  # abandoned compiles of every backend of this process


@atexit.register
def _wait_for_abandoned(limit_s: float = 60.0) -> None:
    """Interpreter exit under a running xgrammar compile aborts the process (its C++ thread pool
    is torn down while busy): give abandoned compiles a bounded time to finish first."""
    deadline = time.monotonic() + limit_s
    for thread in list(_running):
        thread.join(max(0.0, deadline - time.monotonic()))


def _compile(compiler: Any, key: tuple[str, str], so: StructuredOutput, box: dict[str, Any]) -> None:
    """On a helper thread: the compiled grammar, or the error, into ``box``."""
    form, text = key
    try:
        if form == "json":
            box["grammar"] = compiler.compile_json_schema(text, any_whitespace=False)
        elif form == "json_object":  # an object, as OpenAI's json_object promises (the builtin grammar allows any value)
            box["grammar"] = compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
        elif form == "regex":
            box["grammar"] = compiler.compile_regex(text)
        elif form == "choice":
            box["grammar"] = compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in so.choice or []))
        else:
            box["grammar"] = compiler.compile_grammar(text)
    except Exception as e:  # handed to the caller's thread
        box["error"] = e


def _clean_error(error: Exception) -> str:
    """xgrammar prefixes its messages with a time stamp and a C++ source location."""
    return re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", str(error).strip()) or type(error).__name__


class StructuredOutputBackend:
    """Compiles constraints with xgrammar and masks the logits of constrained rows.

    One per engine: the tokenizer info is built once (lazily, so engines that never see a
    constrained request never import xgrammar), and each distinct constraint is compiled once
    while it stays among the ``max_cached`` most recently used. A compile runs on a helper
    thread (xgrammar releases the GIL) and one that outlasts ``compile_timeout_s`` is that
    request's error: the engine's loop moves on, the abandoned compile finishes unseen.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int], *,
                 compile_timeout_s: float = COMPILE_TIMEOUT_S, max_cached: int = MAX_CACHED) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(stop_token_ids)
        self.compile_timeout_s, self.max_cached = compile_timeout_s, max_cached
        self._compiler: Any = None
        self._compiled: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._abandoned: list[threading.Thread] = []
        self._bitmask: Any = None  # reused across steps; grown to the largest batch seen
        self.num_compiled = 0  # distinct constraints compiled (cache misses)

    def _get_compiler(self) -> Any:
        if self._compiler is None:
            import xgrammar as xgr

            if self.tokenizer is None:
                raise ValueError("the model has no tokenizer")
            info = xgr.TokenizerInfo.from_huggingface(
                self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
            )
            self._compiler = xgr.GrammarCompiler(info, max_threads=min(8, os.cpu_count() or 1), cache_enabled=False)
        return self._compiler

    def compile(self, so: StructuredOutput) -> Any:
        """The compiled grammar; raises ValueError naming the problem when it cannot compile."""
        key = so.key()
        grammar = self._compiled.get(key)
        if grammar is not None:
            self._compiled.move_to_end(key)
            return grammar
        compiler = self._get_compiler()
        form, _ = key
        self._abandoned = [t for t in self._abandoned if t.is_alive()]
        _running.intersection_update(t for t in _running if t.is_alive())
        if len(self._abandoned) >= MAX_ABANDONED:
            raise ValueError(f"structured_output.{form} not compiled: {len(self._abandoned)} earlier constraints "
                             "that took too long are still compiling")
        box: dict[str, Any] = {}
        thread = threading.Thread(target=_compile, args=(compiler, key, so, box), daemon=True,
                                  name="tokenmill-grammar")  # daemon: an abandoned compile never holds exit
        thread.start()
        thread.join(self.compile_timeout_s)
        if thread.is_alive():
            self._abandoned.append(thread)  # it cannot be stopped; it finishes unseen
            _running.add(thread)
            raise ValueError(f"structured_output.{form} took longer than {self.compile_timeout_s:g} s to compile; "
                             "simplify the constraint")
        try:
            if "error" in box:
                raise box["error"]
            grammar = box["grammar"]
        except (RuntimeError, ValueError, TypeError) as e:
            raise ValueError(f"structured_output.{form} cannot be compiled: {_clean_error(e)}") from None
        self._compiled[key] = grammar
        while len(self._compiled) > self.max_cached:
            self._compiled.popitem(last=False)  # matchers built from it keep their own reference
        self.num_compiled += 1
        return grammar

    def matcher(self, so: StructuredOutput) -> Any:
        import xgrammar as xgr

        return xgr.GrammarMatcher(self.compile(so))

    def apply_masks(self, logits: Any, matchers: list[Any]) -> Any:
        """Set to -inf the tokens each constrained row's grammar forbids; rows whose matcher
        is None are not touched. Returns the logits (a contiguous copy if they were strided:
        the kernel assumes a dense row-major tensor)."""
        rows = [i for i, m in enumerate(matchers) if m is not None]
        if not rows:
            return logits
        import xgrammar as xgr

        logits = logits.contiguous()
        if self._bitmask is None or self._bitmask.shape[0] < len(matchers):
            self._bitmask = xgr.allocate_token_bitmask(len(matchers), self.vocab_size)
        bitmask = self._bitmask[: len(matchers)]  # only the constrained rows are filled and applied
        for i in rows:
            matchers[i].fill_next_token_bitmask(bitmask, i)
        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=self.vocab_size, indices=rows)
        return logits
