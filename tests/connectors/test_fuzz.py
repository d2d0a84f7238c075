"""Fuzzing the input readers and the spec parser: arbitrary bytes and documents end in rows or
in the documented errors, never in another exception, and no row is dropped."""

from __future__ import annotations

import csv
import io
import uuid

import fsspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from connectors import ShardReadError, list_shards, read_records
from jobs.spec import JobSpec, SpecFileError

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BOM = b"\xef\xbb\xbf"
ASCII_SPACE = b" \t\n\r\x0b\x0c"


def _read(name: str, data: bytes):
    url = f"memory:///fuzz-{uuid.uuid4().hex}/{name}"
    fs, path = fsspec.core.url_to_fs(url)
    fs.pipe(path, data)
    try:
        (shard,) = list_shards(url)
        return [r for batch in read_records(shard, text_field="text", batch_size=7) for r in batch]
    finally:
        fs.rm(path)


def _jsonl_rows_expected(data: bytes) -> int:
    """Lines that are not blank (ASCII white space), the BOM dropped from the first one."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if lines:
        lines[0] = lines[0].removeprefix(BOM)
    return sum(1 for line in lines if line.strip(ASCII_SPACE))


json_lines = st.lists(
    st.one_of(
        st.binary(max_size=40),
        st.from_regex(r'\{"text": ?"[^"\\\n]{0,12}"(, ?"id": ?"[a-z0-9]{1,4}")?\}', fullmatch=True).map(str.encode),
        st.sampled_from([b"[1, 2]", b'{"text": 5}', b'{"text": ""}', b"[" * 3000, b'"\\ud800"', b"null", b"   "]),
    ),
    max_size=12,
)


@FUZZ
@given(json_lines)
def test_jsonl_reader_turns_every_line_into_a_row(lines: list[bytes]) -> None:
    data = b"\n".join(line.replace(b"\n", b" ") for line in lines)
    records = _read("x.jsonl", data)
    assert len(records) == _jsonl_rows_expected(data)  # rows in == rows out
    assert len({r.id for r in records}) == len(records)
    for r in records:
        assert r.error is not None or (isinstance(r.fields["text"], str) and r.fields["text"].strip())


@FUZZ
@given(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=200))
def test_csv_reader_rows_or_a_shard_error(body: str) -> None:
    text = "id,text\n" + body
    try:
        records = _read("x.csv", text.encode("utf-8"))
    except ShardReadError as exc:
        assert str(exc).startswith("cannot read shard memory://")
        return
    expected = sum(1 for row in csv.reader(io.StringIO(text, newline="")) if row) - 1
    assert len(records) == expected
    for r in records:
        assert r.error is not None or r.fields["text"].strip()


toml_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=12,
)
spec_like = st.fixed_dictionaries(
    {},
    optional={
        "name": toml_values, "kind": st.sampled_from(["summarize", "evaluate", "generate", "nope", 3]),
        "input": st.dictionaries(st.sampled_from(["url", "format", "id_field", "text_field", "x"]), toml_values),
        "output": st.dictionaries(st.sampled_from(["url", "x"]), toml_values),
        "prompt": st.dictionaries(st.sampled_from(["system", "template", "few_shot"]), toml_values),
        "sampling": st.dictionaries(st.sampled_from(["max_tokens", "temperature", "top_p", "seed", "stop"]),
                                    toml_values),
        "model": st.dictionaries(st.sampled_from(["name", "dtype"]), toml_values),
        "schedule": toml_values,
    },
)


@FUZZ
@given(spec_like)
def test_spec_parser_accepts_or_names_the_problem(data: dict) -> None:
    try:
        JobSpec.from_dict(data, base_dir="/tmp")
    except ValidationError as exc:
        assert exc.errors()  # each problem names its field
    except (SpecFileError, ValueError) as exc:
        assert str(exc)


@FUZZ
@given(st.binary(max_size=300))
def test_spec_file_of_arbitrary_bytes(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("spec") / "job.toml"
    path.write_bytes(data)
    with pytest.raises((SpecFileError, ValidationError)):
        JobSpec.from_file(path)
