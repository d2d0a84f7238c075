"""An answer's text normalised for comparison (SQuAD-style): what the ``exact`` scoring method
compares and what a majority vote over samples counts."""

from __future__ import annotations

import re
import unicodedata

_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lowercase, punctuation removed, articles removed, whitespace collapsed (SQuAD-style)."""
    text = "".join(ch for ch in str(text).lower() if not unicodedata.category(ch).startswith("P"))
    return " ".join(_ARTICLES.sub(" ", text).split())
