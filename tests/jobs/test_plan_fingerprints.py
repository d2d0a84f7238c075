"""Part fingerprints stay what they were: a re-run reuses the parts it committed before.

The digests were computed before the job kinds owned their steps (when a plan still named
its hooks as strings); a change that moves them makes every committed part stale.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs import JobSpec
from pipeline.manifest import build_manifest
from pipeline.plan import JobPlan

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SHARD = "s3://in/a.jsonl@v1"
SCHEMA = {"type": "object", "required": ["product"],
          "properties": {"product": {"type": "string"}, "price": {"type": "number"}}}


def _spec(kind: str, **sections: Any) -> JobSpec:
    data: dict[str, Any] = {"name": "pin", "kind": kind, "input": {"url": "s3://in/", "id_field": "id"},
                            "output": {"url": "s3://out/"}, "model": {"name": "smollm2-135m-instruct"},
                            "sampling": {"max_tokens": 16}}
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return JobSpec.from_dict(data, base_dir=EXAMPLES)


CASES = {
    "summarize": (lambda: _spec("summarize"), "0c49bf1ae4c30817", (None, None)),
    "evaluate": (lambda: _spec("evaluate", evaluate={"method": "choice"}), "ac6b9dc75427d7b2",
                 ("jobs.scoring:score_row", "jobs.scoring:summarize_scores")),
    "evaluate-ll": (lambda: _spec("evaluate", evaluate={"method": "loglikelihood"}), "09d6808b4df6182c",
                    ("jobs.mc_scoring:score_ll_row", "jobs.mc_scoring:summarize_ll")),
    "evaluate-n": (lambda: _spec("evaluate", sampling={"n": 4, "temperature": 0.8}, evaluate={"pass_k": [1, 4]}),
                   "7609c38584b25f10", ("jobs.scoring:score_row", "jobs.scoring:summarize_scores")),
    "evaluate-openai": (lambda: _spec("evaluate", output={"openai_format": True}), "4052d23c4c9f68a7",
                        ("jobs.scoring:score_row", "jobs.scoring:summarize_scores")),
    "extract": (lambda: _spec("extract", extract={"schema": SCHEMA}), "4a99faccb18e7925",
                ("jobs.extract:extract_row", "jobs.extract:summarize_extract")),
    "generate": (lambda: _spec("generate", prompt={"prompt_field": "prompt"}), "a06066f4d448b74e", (None, None)),
    "generate-n": (lambda: _spec("generate", sampling={"n": 3, "temperature": 0.9}), "3150d88855fceab0",
                   ("jobs.sample_metrics:majority_row", None)),
    "summarize-openai": (lambda: _spec("summarize", output={"openai_format": True}), "414213a0f5ad1ea0",
                         (None, "jobs.openai_merge:merge_summary")),
    "perplexity": (lambda: _spec("perplexity"), "3918c06cf1267491", (None, "jobs.kinds.perplexity:summarize")),
    "openai_batch": (lambda: JobSpec.from_file(EXAMPLES / "openai_batch.toml"), "0321a63ed9223d0f",
                     (None, "jobs.openai_merge:merge_summary")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_part_fingerprint_is_pinned(case: str) -> None:
    make, digest, hooks = CASES[case]
    plan = make().to_plan("pin", read_only=True)
    assert plan.part_fingerprint(SHARD) == f"{SHARD}|plan={digest}"
    assert plan.plan_digest() == digest
    manifest = build_manifest(plan, [], mode="embedded", started_at="t", elapsed_s=0.0)
    assert (manifest["hooks"]["row_hook"], manifest["hooks"]["summary_hook"]) == hooks


def test_a_plan_of_an_earlier_version_reads_with_the_same_fingerprint() -> None:
    """A plan dict from before the renames (``engine`` for the engine settings, ``hook_options`` for the stages' options, hook names) still
    reads, as a worker gets it from the broker during an upgrade, and its parts stay current."""
    plan = _spec("extract", extract={"schema": SCHEMA}).to_plan("pin", read_only=True)
    old = {k: v for k, v in plan.to_dict().items() if k not in ("engine_settings", "stage_options")}
    old.update(engine=plan.engine_settings, hook_options=plan.stage_options, row_hook="jobs.extract:extract_row",
               summary_hook="jobs.extract:summarize_extract", report_hook=None)
    read = JobPlan.from_dict(old)
    assert read == plan and read.engine_settings == {"model": "smollm2-135m-instruct"}
    assert read.part_fingerprint(SHARD) == f"{SHARD}|plan={CASES['extract'][1]}"
