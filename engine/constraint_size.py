"""How large a constraint's grammar would grow, judged before xgrammar compiles it.

xgrammar unrolls bounded repetition: a 43-character pattern ``^[a-z]{8000}$`` compiled for 9.7 s
on this project's 2-core machine, 1,000 strings of at most 1,000 characters for 5.2 s
(``bench/published/grammar-compile-probe-20261128.json``). A compile past the time bound is
abandoned but cannot be stopped, and while two run every new constraint of every caller is
refused: one caller could hold that door shut. So a constraint whose repetition bounds are
large, or multiply out large along one nesting path, is refused at once, before any compile.
A conservative rule, not a cost model (docs/tenants.md gives the probe's figures).
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_REPEAT = 1_000  # one bound: maxLength, maxItems, a regex {n,m}...
MAX_EXPANSION = 10_000  # the bounds along one nesting path, multiplied
MAX_DEPTH = 64  # nested schema objects
_BOUNDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "minContains",
           "maxContains")
_QUANTIFIER = re.compile(r"(?<!\\)\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def _regex_factor(text: str, where: str) -> int:
    product = 1
    for low, high in _QUANTIFIER.findall(text):
        bound = max(int(low), int(high or 0))
        if bound > MAX_REPEAT:
            raise ValueError(f"{where} repeats {bound} times; the limit is {MAX_REPEAT}")
        product *= max(1, bound)
    return product


def _walk(node: Any, where: str, product: int, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ValueError(f"{where} nests deeper than {MAX_DEPTH} levels")
    if isinstance(node, list):
        for item in node:
            _walk(item, where, product, depth + 1)
        return
    if not isinstance(node, dict):
        return
    factor = 1
    for name in _BOUNDS:
        value = node.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if value > MAX_REPEAT:
                raise ValueError(f"{where}: {name} {value:g} is over {MAX_REPEAT}, the largest repetition compiled")
            factor = max(factor, int(value))
    if isinstance(node.get("pattern"), str):
        factor *= _regex_factor(node["pattern"], f"{where}: pattern")
    product *= factor
    if product > MAX_EXPANSION:
        raise ValueError(f"{where}: nested repetition bounds multiply to {product}, over {MAX_EXPANSION}")
    for value in node.values():
        if isinstance(value, (dict, list)):
            _walk(value, where, product, depth + 1)


def check_expansion(form: str, text: str) -> None:
    """A ValueError naming the bound a constraint (``form``, its key text) goes over."""
    where = f"structured_output.{form}"
    if form == "json":
        _walk(json.loads(text), where, 1, 0)
    elif form in ("regex", "grammar"):
        product = _regex_factor(text, where)
        if product > MAX_EXPANSION:
            raise ValueError(f"{where}: its repetition bounds multiply to {product}, over {MAX_EXPANSION}")
