"""Scoring text instead of generating it: log-likelihood of answer choices, and of a whole document.

Log-likelihood (multiple choice, as lm-evaluation-harness does it): for each choice the
request is context tokens + continuation tokens, where the continuation tokens are the
suffix of ``encode(context + continuation)`` after ``encode(context)`` (trailing whitespace
of the context moves to the continuation first). ``prompt_logprobs_start`` = the context
length, so the engine computes logprobs only for the continuation and the prefix cache can
serve the context: the choices of a row are admitted together and share its KV blocks.
The choice's score is the sum of its continuation tokens' logprobs.

A document: its tokens behind one prefix token (BOS, else EOS, as lm-eval's rolling
log-likelihood does), so every token of the document is scored; the row holds the summed
negative log-likelihood and the number of tokens. Two request shapes (``pipeline.kind_stages``):
``ChoiceScoring`` and ``DocumentScoring``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, ClassVar

from engine import SamplingParams
from engine.chat import special_token_strings
from pipeline.plan import JobPlan
from pipeline.sub_requests import RowGroup, RowInputError, SubRequest

if TYPE_CHECKING:
    from pipeline.kind_stages import RowParams
    from pipeline.shard_engine import PromptEngine


def scored_sum(out: Any, token_ids: list[int], start: int) -> float:
    """Sum of the logprobs of ``token_ids[start:]`` from the output's prompt logprobs."""
    entries = out.prompt_logprobs
    if entries is None or len(entries) != len(token_ids):
        raise RuntimeError(f"the engine returned no prompt logprobs for {len(token_ids)} prompt tokens")
    return sum(entries[p][token_ids[p]].logprob for p in range(start, len(token_ids)))


def parse_choices(value: Any, field: str, row: int) -> list[str]:
    """A row's answer choices: a list of strings (a JSON list as text is accepted, for CSV)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise RowInputError(f"row {row}: field {field!r} is not a list of choices") from None
    if not isinstance(value, list) or len(value) < 2 or not all(isinstance(c, str) and c for c in value):
        raise RowInputError(f"row {row}: field {field!r} must be a list of at least 2 non-empty strings")
    return value


def _params(start: int) -> SamplingParams:
    return SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, prompt_logprobs_start=start)


class ChoiceScoring:
    """One request per answer choice (``mode_options``: ``choices_field``, ``chat_template``,
    ``target_delimiter``); the best-scored choice is the row's ``output``."""

    columns: ClassVar[tuple[str, ...]] = ("choice_logprobs", "choice_tokens")

    def __init__(self, plan: JobPlan, engine: PromptEngine, row_params: RowParams | None = None) -> None:
        self.plan = plan
        self.engine = engine
        options = plan.mode_options
        self.choices_field = options.get("choices_field", "choices")
        self.chat = bool(options.get("chat_template", True))
        default_delimiter = "" if self.chat else " "
        self.delimiter = options.get("target_delimiter", default_delimiter)
        self.specials = special_token_strings(engine.tokenizer) if engine.tokenizer is not None else []

    def context_text(self, messages: list[dict[str, str]]) -> str:
        """The chat rendered as text, ready for the answer; or plain text turns joined by blank lines."""
        if self.chat:
            return self.engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        parts, pending_user = [], None
        for m in messages:
            if m["role"] == "user":
                pending_user = m["content"]
            elif m["role"] == "assistant" and pending_user is not None:
                parts.append(pending_user + self.delimiter + m["content"])
                pending_user = None
            else:
                parts.append(m["content"])
        if pending_user is not None:
            parts.append(pending_user)
        return "\n\n".join(parts)

    def build(self, fields: dict[str, Any], row: int, messages: list[dict[str, str]]) -> list[SubRequest]:
        choices = parse_choices(fields.get(self.choices_field), self.choices_field, row)
        texts = [m["content"] for m in messages] + choices
        special = next((s for s in self.specials for t in texts if s in t), None)
        if special is not None:  # documents are data: never let row text become a control token
            raise RowInputError(f"row {row}: the question or a choice contains the special token {special!r}, "
                                "which log-likelihood scoring cannot keep literal")
        context = self.context_text(messages)
        spaces = len(context) - len(context.rstrip())
        moved = context[len(context) - spaces:] if spaces else ""
        context = context[: len(context) - spaces]
        ctx_ids = self.engine.encode(context)
        subs = []
        for choice in choices:
            whole = self.engine.encode(context + moved + self.delimiter + choice)
            cont = whole[len(ctx_ids):]
            if not cont:
                raise RowInputError(f"row {row}: choice {choice!r} adds no tokens to the context")
            subs.append(SubRequest(ctx_ids + cont, _params(len(ctx_ids)), scored_from=len(ctx_ids), label=choice))
        return subs

    def values(self, group: RowGroup) -> dict[str, Any]:
        """The shape's columns for a finished row without errors."""
        sums = [scored_sum(group.outputs[i], s.token_ids, s.scored_from or 0) for i, s in enumerate(group.subs)]
        best = max(range(len(sums)), key=sums.__getitem__)
        return {"output": group.subs[best].label, "choice_logprobs": sums,
                "choice_tokens": [len(s.token_ids) - (s.scored_from or 0) for s in group.subs]}


class DocumentScoring:
    """Every token of the row's text scored: ``nll`` (nats) and ``tokens``."""

    columns: ClassVar[tuple[str, ...]] = ("nll", "tokens")

    def __init__(self, plan: JobPlan, engine: PromptEngine, row_params: RowParams | None = None) -> None:
        self.plan = plan
        self.engine = engine

    def build(self, fields: dict[str, Any], row: int, messages: list[dict[str, str]]) -> list[SubRequest]:
        tok = self.engine.tokenizer
        prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        text = str(fields.get(self.plan.text_field, ""))  # special-token strings stay literal text
        ids = tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        budget = self.engine.max_model_len - 1  # room for the one generated token
        if len(ids) + 1 > budget:
            if not self.plan.truncate_prompt:
                raise RowInputError(
                    f"row {row}: document is {len(ids)} tokens, over the {budget - 1} that fit the context "
                    "(set truncate_prompt = true to score its beginning)"
                )
            ids = ids[: budget - 1]
        return [SubRequest([prefix, *ids], _params(1), scored_from=1)]

    def values(self, group: RowGroup) -> dict[str, Any]:
        """The shape's columns for a finished row without errors."""
        (sub,) = group.subs
        return {"nll": -scored_sum(group.outputs[0], sub.token_ids, 1), "tokens": len(sub.token_ids) - 1}
