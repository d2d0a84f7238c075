"""The parts every kind writes stay byte-identical (issue 40: the row path's types change, not its output).

A small fixed job of each kind runs through the shard driver on ``PinEngine`` (fixed outputs
for every request mode); its part's Arrow schema, its rows and the SHA-256 of the Parquet file
(and of the OpenAI lines, where the plan writes them) are pinned. The clock, the commit id and
the input's fingerprint are fixed so the bytes depend on the code only. The file digests also
depend on the Parquet writer: they are checked under the pyarrow version they were taken with.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pin_engine import PinEngine

import connectors.parquet_sink as parquet_sink
import pipeline.in_flight as in_flight
import pipeline.openai_output as openai_output
import pipeline.row_flow as row_flow
import pipeline.shard_driver as shard_driver
from connectors import list_shards
from jobs import JobSpec
from pipeline.shard_driver import ShardDriver
from pipeline.shard_outcome import ShardState

DATA = Path(__file__).resolve().parents[2] / "examples" / "data"
PINNED_PYARROW = "26.0.1"
SCHEMA = {"type": "object", "required": ["product"],
          "properties": {"product": {"type": "string"}, "price": {"type": "number"}}}


def _lines(name: str, count: int) -> list[str]:
    return (DATA / name).read_text().splitlines()[:count]


def _batch(url: str, body: dict[str, Any], n: int) -> list[str]:
    return [json.dumps({"custom_id": f"r{i}", "method": "POST", "url": url, "body": body(i)}) for i in range(n)]


MCQ = _lines("mcq.jsonl", 4) + ['{"id": "q-bad"}']
CASES: dict[str, tuple[dict[str, Any], list[str]]] = {
    "summarize": ({"kind": "summarize", "input": {"text_field": "text", "passthrough": ["source"]}},
                  _lines("perplexity.jsonl", 3) + ['{"id": "no-text"}', '{"id": "again", "text": "a"}', '{"id": "same", "text": "a"}']),
    "generate": ({"kind": "generate", "prompt": {"prompt_field": "text"}}, _lines("perplexity.jsonl", 3)),
    "generate-n": ({"kind": "generate", "sampling": {"n": 3, "temperature": 0.9, "seed": 1}},
                   _lines("perplexity.jsonl", 3)),
    "evaluate": ({"kind": "evaluate", "input": {"text_field": "question", "passthrough": ["subject"]},
                  "prompt": {"template": "{question}\n{options}"}, "evaluate": {"method": "choice"}}, MCQ),
    "evaluate-n": ({"kind": "evaluate", "input": {"text_field": "question"}, "sampling": {"n": 4, "temperature": 0.8},
                    "evaluate": {"method": "choice", "pass_k": [1, 4]}}, MCQ),
    "evaluate-openai": ({"kind": "evaluate", "input": {"text_field": "question"}, "output": {"openai_format": True},
                         "evaluate": {"method": "exact"}}, MCQ),
    "evaluate-ll": ({"kind": "evaluate", "input": {"text_field": "question"}, "evaluate": {"method": "loglikelihood"}},
                    _lines("mmlu_style.jsonl", 4)),
    "evaluate-ll-plain": ({"kind": "evaluate", "input": {"text_field": "question"},
                           "evaluate": {"method": "loglikelihood", "chat_template": False}}, _lines("mmlu_style.jsonl", 3)),
    "extract": ({"kind": "extract", "input": {"text_field": "text"}, "extract": {"schema": SCHEMA},
                 "sampling": {"max_tokens": 40}}, _lines("extract.jsonl", 8)),
    "perplexity": ({"kind": "perplexity", "input": {"text_field": "text", "passthrough": ["source"]}},
                   _lines("perplexity.jsonl", 3) + ['{"id": "empty", "text": ""}']),
    "embed": ({"kind": "embed", "input": {"text_field": "text"}, "embed": {"dimensions": 8}},
              _lines("perplexity.jsonl", 3)),
    "harness_requests": ({"kind": "harness_requests"}, _lines("harness_requests.jsonl", 8)),
    "openai_batch": ({"kind": "openai_batch"}, _lines("batch_features.jsonl", 8)),
    "openai_batch-completions": (
        {"kind": "openai_batch"},
        _batch("/v1/completions", lambda i: {"model": "m", "prompt": f"Count to {i}", "max_tokens": 4 + i}, 3)),
    "openai_batch-embeddings": (
        {"kind": "openai_batch"},
        _batch("/v1/embeddings", lambda i: {"model": "m", "input": f"text {i}", **({"dimensions": 4} if i else {})}, 3)),
}

# case -> (SHA-256 of the Arrow schema's text, SHA-256 of the rows as JSON,
#          SHA-256 of the Parquet file, SHA-256 of the OpenAI lines or None)
PINS: dict[str, tuple[str, str, str, str | None]] = {
    'embed': (
        '7e87136ff10aefc893201a70ef795d775c5675dd8ad3be3454581c4980fce305',
        '6c4e27de61658e95a102c498599fd901020a8fd06c231d88b6480bbe31b890d1',
        'aa8570e4e677dfb8b56725d149886485c8111391de17eada267732c238688330',
        None,
    ),
    'evaluate': (
        '614a827fca8562118fe96d02d21f04ea1b412fb9881033869b4a5eea0e56498a',
        'eb853ff03b60c61ba0a774977e6364bc15c52dcc1d6f9cebe46d295b914e89cb',
        '6648f17e21ad18cd90384de29aa0c720fa1fcc942d2bc5326534f8d84214e207',
        None,
    ),
    'evaluate-ll': (
        '73327da457a6d95f0644b3f8f652b436dd1a25a07cae04d52942b890b0a175ed',
        'a33a2d56382d6cdda7bc61a09b173c1302b116026f9c49308a0432b6e410610d',
        '71e959e883c8af5ffac9ab50007fce09796470e467da54e0be44a9a4c02fa577',
        None,
    ),
    'evaluate-ll-plain': (
        '73327da457a6d95f0644b3f8f652b436dd1a25a07cae04d52942b890b0a175ed',
        '11db50af3f4baf1f3c6520be08f3876be5c5fa55cda303938e16ff967c0f3a3e',
        'df2a3060f5550beadf8fb862036b491f4a9788d862384c1dbdaf44288e6e519e',
        None,
    ),
    'evaluate-n': (
        '18892b06c196a98da4b2d3a7af175b629d1be1a98948d9ea7947c2b49edeeb0c',
        '150fbc8b56522cbf7d3ad673ab9dde0691d4f871448fa2bc02b8ac6d914fc6e6',
        '55de6c58fdd88233c2c069613770ff7127bc50c6c427d220f31276786089997e',
        None,
    ),
    'evaluate-openai': (
        'cc57fca7e4625db39586f2e0b9bdae73cde9cb82375c5d1d71791c7de03cda39',
        '3c4dc7932f6428b64f8f8ca66ff4e05fe6c1038ccccdd4e6fcd8fb936490b319',
        'e22ef28b299a0c9162a8337862cad9f306923b141e6bfc8456789a15a15e6005',
        'c897f8fef9344f83d1fd8cb72834bc2d06c73c8309e953634d45053e503011d4',
    ),
    'extract': (
        '51092b55473f9ed106c907bd46ae562f865d18b367c5a14d4d468db1ac6cd82f',
        'c10654213571f0d0b4cdf33c43a867263e012a62cdd92b33da99490ce781e6cb',
        '493f3598931fa7c6a613c6658461e1f51f3bd0c34fb59fac6b46910a3e8b2a81',
        None,
    ),
    'generate': (
        '169ad6b1676a3dec77b87d409b91e086561fa2e4891d2c15cc2078f15c7e6aab',
        '754e43fa8116cabd9ed28ada06c2e5b526844fa59e90a2217a8fc9d3003a45af',
        '8feab9e89466b0a17b0b6aa1af25b7243d312e28e041817ad72d0bd0f6df21a2',
        None,
    ),
    'generate-n': (
        'a6b3d6dfa46d9e5bbdf0454bdc015fcce00ff13722027509d87b4fe88ee56a2e',
        'e08072c475a6ffea2731df97e0b3896eaa26af29f1035ce02d0af9d243278c8c',
        '1a6351af2e128a8c5f901a24c743dd15303ee1108028e92f8b2f35a0275bc722',
        None,
    ),
    'harness_requests': (
        '87d3c3e5e511122bdb41adbb7fb5227fca4eb45987f4c1f9d5dee29978ab4f3f',
        'b87f2e7bdfb3283ba4f40b61c03e62870994bce08f98fc8653168d480e18e267',
        'ac8476624235427158b58b83f9ee382d3b977dadf2ae3d9f63d479ee8781a8b7',
        None,
    ),
    'openai_batch': (
        '169ad6b1676a3dec77b87d409b91e086561fa2e4891d2c15cc2078f15c7e6aab',
        '0f42816644b968b2a3111b99a37cd82691933f29347713e5ff6a19395d3eeb8f',
        'd59b0f31c19eec2ab176054e6fb7ed3aaeb942711a97cea4e972c953d741fcc9',
        '600bb90bb743fbe39d734f84bb9dc558f407f7f2811f93adeab93505468a6d8b',
    ),
    'openai_batch-completions': (
        '169ad6b1676a3dec77b87d409b91e086561fa2e4891d2c15cc2078f15c7e6aab',
        '8b020c8e18007be044aacd7c350dddcf3495523cd4db5e10d589c566555a9c75',
        '17fbab614dcf0b8de180eccfe4a146a9296e395ed1c7c44dcfe31be0521fd68f',
        '3726c09dc868f40a098cb64f5d3040ee0a45996b80931a3fb14b567c764919df',
    ),
    'openai_batch-embeddings': (
        '41df8033ad714b90e33c0981f1dc04ad6974bce308eda2e21f676e1ac19ec9aa',
        'ea0a5c906a206370f512a2ee57ef31bf333ac4277f25b2c6592746e49fba3e5f',
        '5a772b540171b9b264019c2682bfd6a8a4a63c43ee52042fde145bf97f5d6953',
        'a9cf83e776b1f2bb245ccdc140feb1aa9f02eccde1a10b389c20461d025d22e2',
    ),
    'perplexity': (
        'd738f535b8a59bba58cc8fdae18860a1e9c90a930fb7868c71234ab55e687278',
        'f0d872a0c78092b40833cb03f5e423d365dc826cc1d779d36dfb306d2bc7cea2',
        '4b44e68c7380fb00aac2b32066bc4258d268f41e2620d404802913b0fd0fe644',
        None,
    ),
    'summarize': (
        '1afaae0acc00c4e9dd96c86a75fbb3182b00c39cab3cfe87c6613cbc0573408a',
        'c5a5073946edb101c8814286caa294dc3b19aad6af60503cc51b80cbc76c1541',
        'cc315f6badda86ff03d7963470b669cc9cedff0ffe90d48811a5cdb60619a7c3',
        None,
    ),
}


def _spec(kind_fields: dict[str, Any], tmp_path: Path) -> JobSpec:
    data: dict[str, Any] = {"name": "pin", "input": {"url": str(tmp_path / "in"), "id_field": "id"},
                            "output": {"url": str(tmp_path / "out")}, "model": {"name": "smollm2-135m-instruct"},
                            "sampling": {"max_tokens": 8}}
    for key, value in kind_fields.items():
        data[key] = {**data[key], **value} if isinstance(data.get(key), dict) else value
    if data["kind"] == "openai_batch":
        data["input"] = {"url": data["input"]["url"]}
    return JobSpec.from_dict(data)


def _fix_clock_and_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = types.SimpleNamespace(perf_counter=lambda: 100.0, monotonic=lambda: 100.0, time=lambda: 1_700_000_000.0)
    for module in (shard_driver, in_flight, openai_output, row_flow):  # every clock a row's latency reads
        monkeypatch.setattr(module, "time", clock)
    monkeypatch.setattr(parquet_sink, "uuid", types.SimpleNamespace(uuid4=lambda: uuid.UUID(int=40)))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def written(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, str, str | None]:
    """Run the case's job; the digests of its part."""
    kind_fields, lines = CASES[case]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "rows.jsonl").write_text("".join(line + "\n" for line in lines))
    _fix_clock_and_ids(monkeypatch)
    plan = _spec(kind_fields, tmp_path).to_plan("pin-job")
    shards = [dataclasses.replace(s, fingerprint="pinned")
              for s in list_shards(plan.input_url, storage_options=plan.storage_options)]
    (outcome,) = list(ShardDriver(PinEngine(), plan).run(shards))
    assert outcome.state == ShardState.DONE, outcome.reason
    (part,) = (tmp_path / "out").glob("part-*.parquet")
    table = pq.read_table(part)
    assert table.num_rows == len(lines)
    schema = str(table.schema.remove_metadata())
    rows = json.dumps(table.to_pylist(), sort_keys=True, default=repr)
    jsonl = list((tmp_path / "out").glob("part-*.jsonl"))
    return _sha(schema.encode()), _sha(rows.encode()), _sha(part.read_bytes()), \
        _sha(jsonl[0].read_bytes()) if jsonl else None


@pytest.mark.parametrize("case", sorted(CASES))
def test_part_bytes_are_pinned(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    schema, rows, part, lines = written(case, tmp_path, monkeypatch)
    want = PINS[case]
    assert (schema, rows, lines) == (want[0], want[1], want[3])
    if pa.__version__ != PINNED_PYARROW:
        pytest.skip(f"the Parquet file digest is pinned under pyarrow {PINNED_PYARROW}, not {pa.__version__}")
    assert part == want[2]


def test_a_result_rows_values_are_in_schema_order() -> None:
    """``ResultRow.values`` lists the fixed columns as the schema does, passthrough fields after
    ``id``, then the row's other columns; a mode's fixed-column values land in their fields."""
    from pipeline.output_columns import FIXED_COLUMNS
    from pipeline.result_row import RequestResult, ResultRow

    result = RequestResult.from_values({"output": "B", "choice_logprobs": [-1.0, -2.0], "prompt_tokens": 7})
    assert (result.output, result.prompt_tokens, dict(result.columns)) == ("B", 7, {"choice_logprobs": [-1.0, -2.0]})
    row = ResultRow(id="r", passthrough={"lang": "en"}, output="B", finish_reason="stop", prompt_tokens=7,
                    output_tokens=0, cached_prompt_tokens=0, error=None, latency_s=0.5, content_key="k",
                    columns={"score": 1.0})
    assert list(row.values()) == ["id", "lang", *list(FIXED_COLUMNS)[1:], "score"]
