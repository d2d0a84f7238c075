"""Input data and plans shared by the pipeline and fleet tests."""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from connectors import filesystem_for
from pipeline.plan import JobPlan, PromptPlan

Put = Callable[[str, bytes], None]


def tiny_engine(model_dir: Path, **overrides: Any) -> dict[str, Any]:
    """Small, single-threaded engine settings: two processes share two cores in the fleet tests."""
    return {"model": str(model_dir), "max_num_seqs": 8, "max_num_batched_tokens": 512, "num_kv_blocks": 512,
            "num_threads": 1, **overrides}


def tiny_model_toml(model_dir: Path) -> str:
    """``[model]`` of a spec with ``tiny_engine``'s settings (a run in process reuses its engine)."""
    settings = tiny_engine(model_dir)
    lines = [f'path = "{settings.pop("model")}"'] + [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    return "[model]\n" + "\n".join(lines) + "\n"


def make_plan(input_url: str, output_url: str, model_dir: Path, **overrides: Any) -> JobPlan:
    values: dict[str, Any] = dict(
        job_id="test-job", name="test", kind="summarize", input_url=input_url, output_url=output_url,
        id_field="id", passthrough_fields=["lang"],
        prompt=PromptPlan(system="Summarize the document in one sentence.", user_template="Document ({lang}): {text}"),
        sampling={"max_tokens": 4, "temperature": 0.0, "ignore_eos": True},
        engine_settings=tiny_engine(model_dir),
    )
    values.update(overrides)
    return JobPlan(**values)


def local_put(root: Path) -> Put:
    def put(name: str, data: bytes) -> None:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)

    return put


def jsonl_bytes(rows: list[Any]) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode()


def csv_bytes(header: list[str], rows: list[list[str]]) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue().encode()


def parquet_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def write_mixed_inputs(put: Put, prefix: str = "", n: int = 6) -> dict[str, list[str | None]]:
    """One shard per format with good and bad rows; returns {file name: ids in input order}
    (None where a bad row has no id; its output id is '<file>:<row>')."""
    files: dict[str, list[str | None]] = {}
    good = [{"id": f"j{i}", "text": f"jsonl document number {i}.", "lang": "en"} for i in range(n)]
    jsonl_rows: list[Any] = [
        *good,
        "{not json",
        {"id": "j-empty", "text": "", "lang": "en"},
        {"id": "j-notext", "lang": "en"},
        {"id": "j-nolang", "text": "a document without the lang field"},  # template field missing
    ]
    put(f"{prefix}a.jsonl", jsonl_bytes(jsonl_rows))
    files["a.jsonl"] = [r["id"] for r in good] + [None, "j-empty", "j-notext", "j-nolang"]
    csv_rows = [[f"c{i}", f"csv document {i}", "fr"] for i in range(n)] + [["c-short", "too few"]]
    put(f"{prefix}b.csv", csv_bytes(["id", "text", "lang"], csv_rows))
    files["b.csv"] = [r[0] for r in csv_rows]
    ids = [f"p{i}" for i in range(n)]
    table = pa.table({"id": ids, "text": [f"parquet document {i}" for i in range(n)], "lang": ["de"] * n})
    put(f"{prefix}c.parquet", parquet_bytes(table))
    files["c.parquet"] = list(ids)
    return files


def expected_ids(files: dict[str, list[str | None]]) -> list[str]:
    out = []
    for name, ids in files.items():
        for row, rid in enumerate(ids):
            out.append(rid if rid is not None else f"{name}:{row}")
    return out


def write_uniform_shards(put: Put, count: int, rows: int, prefix: str = "", words: int = 12) -> list[str]:
    """``count`` JSONL shards of ``rows`` good rows each; returns all ids."""
    ids = []
    for s in range(count):
        shard = [{"id": f"s{s}-r{r}", "text": " ".join(f"w{s}{r}{k}" for k in range(words)), "lang": "en"}
                 for r in range(rows)]
        put(f"{prefix}shard-{s:03d}.jsonl", jsonl_bytes(shard))
        ids += [x["id"] for x in shard]
    return ids


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    """Poll ``predicate`` until it returns something truthy; a named TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class Where:
    input_url: str
    output_url: str
    options: dict[str, Any]
    client: Any = None  # boto3, for S3: test setup that bypasses the code under test

    def put(self, name: str, data: bytes) -> None:
        if self.client is None:
            Path(self.input_url, name).write_bytes(data)
            return
        bucket, key = self.input_url.removeprefix("s3://").split("/", 1)
        self.client.put_object(Bucket=bucket, Key=f"{key}/{name}", Body=data)

    def files(self, url: str) -> list[str]:
        """Names of the objects under ``url`` (SeaweedFS also lists folders left empty: not objects)."""
        fs, path = filesystem_for(url, self.options)
        fs.invalidate_cache()
        found = fs.find(path, detail=True) if fs.exists(path) else {}
        return sorted(p.rsplit("/", 1)[1] for p, info in found.items() if info.get("type") == "file" and info.get("size"))
