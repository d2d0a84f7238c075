"""A finished output holds its parts, the manifest and ``_SUCCESS``, nothing else (issue 41,
point 5): no empty ``_tmp/`` or ``_checkpoints/`` folder locally, and no object (a folder
marker or a temporary) under those prefixes on S3 (moto), after a run that took checkpoints."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline_support import Where, jsonl_bytes, make_plan

from pipeline.job_runner import run_embedded


def _everything(where: Where) -> list[str]:
    """Every file and folder under the output (local), or every object key (S3), relative."""
    if where.client is None:
        root = where.output_url
        return sorted(os.path.relpath(os.path.join(d, n), root) + ("/" if n in dirs else "")
                      for d, dirs, files in os.walk(root) for n in [*dirs, *files])
    bucket, prefix = where.output_url.removeprefix("s3://").split("/", 1)
    listing = where.client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
    return sorted(o["Key"].removeprefix(prefix + "/") for o in listing.get("Contents", []))


def test_a_finished_output_has_no_helper_folders(where: Where, tiny_model_dir: Path) -> None:
    for name in ("a.jsonl", "b.jsonl"):
        where.put(name, jsonl_bytes([{"id": f"{name}-{i}", "text": f"doc {i}", "lang": "en"} for i in range(12)]))
    plan = make_plan(where.input_url, where.output_url, tiny_model_dir, storage_options=where.options,
                     checkpoint_rows=4)  # three checkpoints a shard
    assert run_embedded(plan, progress=False)["status"] == "succeeded"
    found = _everything(where)
    parts = [n for n in found if n.startswith("part-") and n.endswith(".parquet")]
    assert len(parts) == 2
    assert found == sorted([*parts, "_SUCCESS", "_manifest.json"])
