"""A constraint built to explode compile time is refused before xgrammar sees it (issue 39):
a 43-character pattern compiled for 9.7 s here, and a compile past its time bound cannot be
stopped (two such kept every caller's new constraints out)."""

from __future__ import annotations

import pytest

from engine import SamplingParams
from engine.structured_output import StructuredOutput


def _nested(depth: int) -> dict:
    node: dict = {"type": "string"}
    for _ in range(depth):
        node = {"type": "object", "properties": {"a": node}}
    return node


@pytest.mark.parametrize(("constraint", "message"), [
    ({"json": {"type": "string", "maxLength": 10_000_000}},
     "structured_output.json: maxLength 1e+07 is over 1000, the largest repetition compiled"),
    ({"json": {"type": "string", "minLength": 100_000}}, "structured_output.json: minLength 100000 is over 1000"),
    ({"json": {"type": "array", "items": {"type": "string", "maxLength": 1000}, "maxItems": 1000}},
     "structured_output.json: nested repetition bounds multiply to 1000000, over 10000"),
    ({"json": {"type": "string", "pattern": "^[a-z]{8000}$"}},
     "structured_output.json: pattern repeats 8000 times; the limit is 1000"),
    ({"json": {"type": "object", "properties": {"x": {"type": "array", "maxItems": 500,
                                                      "items": {"type": "string", "pattern": "[0-9]{1,100}"}}}}},
     "structured_output.json: nested repetition bounds multiply to 50000, over 10000"),
    ({"regex": "(a{1,1000}){1,1000}"}, "structured_output.regex: its repetition bounds multiply to 1000000"),
    ({"regex": "[a-z]{1,100000}"}, "structured_output.regex repeats 100000 times; the limit is 1000"),
    ({"grammar": 'root ::= "a"{5000}'}, "structured_output.grammar repeats 5000 times"),
    ({"json": _nested(80)}, "structured_output.json nests deeper than 64 levels"),
])
def test_an_exploding_constraint_is_refused_before_it_compiles(constraint, message):
    with pytest.raises(ValueError) as caught:
        SamplingParams(max_tokens=4, structured_output=constraint)
    assert str(caught.value).startswith(message), str(caught.value)


@pytest.mark.parametrize("constraint", [
    {"json": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 200},
                                               "tags": {"type": "array", "maxItems": 10,
                                                        "items": {"type": "string", "maxLength": 30}}}}},
    {"regex": r"\d{4}-\d{2}-\d{2}"}, {"regex": r"\{[a-z]{1,20}\}"}, {"json": _nested(30)},
    {"grammar": 'root ::= "yes" | "no"'},
])
def test_ordinary_constraints_pass(constraint):
    assert StructuredOutput(**constraint).form in constraint
