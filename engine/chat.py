"""Chat messages to prompt token ids where message content is always literal text.

A chat template's markup (``<|im_start|>user`` ...) is made of the model's special tokens.
Tokenizing the rendered chat in one piece recognises those strings wherever they occur,
so a document containing ``<|im_end|>\\n<|im_start|>system`` would open a real system
turn. Here every message's content is tokenized with special tokens split into plain text
(``split_special_tokens``); only the text the template itself adds may produce them.

A chat whose content holds no special-token string is tokenized in one piece, exactly as
``apply_chat_template`` does (so ordinary rows keep their usual tokens at the seams).
"""

from __future__ import annotations

from typing import Any

# Private-use characters: they stand for each message's content while the template renders.
_OPEN, _CLOSE = "\ue000", "\ue001"


def special_token_strings(tokenizer: Any) -> list[str]:
    """Every added token the tokenizer treats as special (control tokens)."""
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    found = {t.content for t in decoder.values() if getattr(t, "special", False)}
    found.update(getattr(tokenizer, "all_special_tokens", []) or [])
    return sorted(found)


def special_token_ids(tokenizer: Any) -> set[int]:
    return {i for i in (tokenizer.convert_tokens_to_ids(s) for s in special_token_strings(tokenizer)) if i is not None}


def _plain_ids(ids: Any) -> list[int]:
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def chat_token_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of ``messages`` rendered with the tokenizer's chat template, ready for generation."""
    specials = special_token_strings(tokenizer)
    if not any(s in m["content"] for m in messages for s in specials):
        return _plain_ids(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
    stand_ins = [dict(m, content=f"{_OPEN}{i}{_CLOSE}") for i, m in enumerate(messages)]
    rendered = tokenizer.apply_chat_template(stand_ins, add_generation_prompt=True, tokenize=False)
    ids: list[int] = []
    rest = rendered
    for i, m in enumerate(messages):
        marker = f"{_OPEN}{i}{_CLOSE}"
        markup, found, rest = rest.partition(marker)
        if not found:
            raise ValueError("the chat template does not place message content verbatim; cannot keep it literal")
        ids += tokenizer(markup, add_special_tokens=False)["input_ids"] if markup else []
        if m["content"]:
            ids += tokenizer(m["content"], add_special_tokens=False, split_special_tokens=True)["input_ids"]
    if rest:
        ids += tokenizer(rest, add_special_tokens=False)["input_ids"]
    return ids
