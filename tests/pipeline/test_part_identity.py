"""Issue 23, point 6: the manifest records each part's identity beyond its name (the commit id
in its footer), so a part another run replaced is detected at finalization and by
``tokenmill status``; and a part's JSON lines are never committed ahead of its Parquet part.
Embedded runs of the tiny model on moto S3."""

from __future__ import annotations

import copy

from pipeline_support import jsonl_bytes, make_plan

import pipeline.part_sink as part_sink
from connectors import (
    PartWriter,
    filesystem_for,
    list_shards,
    part_lines_are_current,
    part_lines_url,
    part_name,
    read_manifest,
    read_part_commit,
    read_parts,
    success_marker_exists,
)
from pipeline.fleet import job_status
from pipeline.job_runner import run_embedded
from pipeline.shard_outcome import ShardState

REPLACED = "part replaced by another run (its commit is "


def _plan(s3_server, bucket: str, model_dir, **overrides):
    client = s3_server.client()
    for i in range(2):
        client.put_object(Bucket=bucket, Key=f"in/docs-{i}.jsonl", Body=jsonl_bytes(
            [{"id": f"s{i}-r{r}", "text": f"document {i} row {r}", "lang": "en"} for r in range(2)]))
    return make_plan(f"s3://{bucket}/in/", f"s3://{bucket}/out", model_dir, job_id="identity",
                     storage_options={"client_kwargs": {"endpoint_url": s3_server.endpoint_url}}, **overrides)


def _replace_part(plan, index: int) -> str:
    """Another run writes shard ``index``'s part again: same name, same plan, a new commit."""
    ref = list_shards(plan.input_url, storage_options=plan.storage_options)[index]
    table = read_parts(plan.output_url, plan.output_options, parts=[part_name(ref.part_id)])
    writer = PartWriter(plan.output_url, ref.part_id, table.schema,
                        fingerprint=plan.part_fingerprint(ref.fingerprint), storage_options=plan.output_options)
    writer.write(table)
    writer.commit_with_result({"rows": table.num_rows})
    return writer.commit_id


def _exists(plan, url: str) -> bool:
    fs, path = filesystem_for(url, plan.output_options)
    fs.invalidate_cache()
    return fs.exists(path)


def test_a_part_replaced_during_the_run_fails_its_shard_at_finalization(s3_server, s3_bucket, tiny_model_dir):
    plan = _plan(s3_server, s3_bucket, tiny_model_dir)
    intruder: list[str] = []

    def replace_first(outcome) -> None:
        if outcome.state == ShardState.DONE and not intruder:
            intruder.append(_replace_part(plan, outcome.index))

    manifest = run_embedded(plan, progress=False, cross_shard=False, on_progress=replace_first)
    assert read_manifest(plan.output_url, plan.output_options) == manifest
    first, second = manifest["shards"]
    assert first["status"] == "failed" and first["reason"].startswith(REPLACED + intruder[0])
    assert second["status"] == "done" and second["part_commit"] == read_part_commit(
        plan.output_url, list_shards(plan.input_url, storage_options=plan.storage_options)[1].part_id,
        plan.output_options)
    assert manifest["status"] == "completed_with_errors" and manifest["parts"] == [second["part_file"]]
    assert manifest["totals"]["shards_done"] == 1 and manifest["totals"]["shards_failed"] == 1
    assert not success_marker_exists(plan.output_url, plan.output_options)


def test_status_detects_a_part_replaced_after_the_run(s3_server, s3_bucket, tiny_model_dir):
    plan = _plan(s3_server, s3_bucket, tiny_model_dir)
    assert run_embedded(plan, progress=False)["status"] == "succeeded"
    assert job_status(plan)["status"] == "succeeded"
    commit = _replace_part(plan, 1)
    state = job_status(plan)
    assert state["status"] == "incomplete"
    assert [s["state"] for s in state["shards"]] == ["done", "queued"]
    assert state["shards"][1]["reason"].startswith(REPLACED + commit)


def test_a_part_that_fails_leaves_no_json_lines(s3_server, s3_bucket, tiny_model_dir, monkeypatch):
    plan = _plan(s3_server, s3_bucket, tiny_model_dir, openai_output=True)
    refs = list_shards(plan.input_url, storage_options=plan.storage_options)
    commit = PartWriter.commit_with_result

    def failing(self, result, lines_sha256=None):
        if self.url.endswith(part_name(refs[0].part_id)):
            raise PermissionError("injected: access denied")
        return commit(self, result, lines_sha256)

    monkeypatch.setattr(PartWriter, "commit_with_result", failing)
    manifest = run_embedded(plan, progress=False)
    assert [s["status"] for s in manifest["shards"]] == ["failed", "done"]
    assert "cannot write the output part: PermissionError" in manifest["shards"][0]["reason"]
    assert not _exists(plan, part_lines_url(plan.output_url, refs[0].part_id))
    assert _exists(plan, part_lines_url(plan.output_url, refs[1].part_id))


def test_a_part_whose_json_lines_did_not_follow_is_written_again(s3_server, s3_bucket, tiny_model_dir,
                                                                  monkeypatch):
    plan = _plan(s3_server, s3_bucket, tiny_model_dir, openai_output=True)
    refs = list_shards(plan.input_url, storage_options=plan.storage_options)

    def lost(*args, **kwargs):
        raise PermissionError("injected: the worker died here")

    with monkeypatch.context() as patch:
        patch.setattr(part_sink, "write_part_lines", lost)
        manifest = run_embedded(plan, progress=False)
    assert [s["status"] for s in manifest["shards"]] == ["failed", "failed"]
    assert manifest["shards"][0]["reason"].startswith("cannot write the output part's JSON lines: PermissionError")
    assert not part_lines_are_current(plan.output_url, refs[0].part_id, plan.output_options)

    again = run_embedded(plan, progress=False)
    assert [s["status"] for s in again["shards"]] == ["done", "done"]  # not skipped: the lines were missing
    assert all(part_lines_are_current(plan.output_url, r.part_id, plan.output_options) for r in refs)
    assert [s["status"] for s in run_embedded(plan, progress=False)["shards"]] == ["skipped", "skipped"]


def test_the_manifest_records_each_parts_commit(s3_server, s3_bucket, tiny_model_dir):
    field = "part_commit"
    plan = _plan(s3_server, s3_bucket, tiny_model_dir)
    first = run_embedded(plan, progress=False)
    again = run_embedded(plan, progress=False)  # skipped shards: the commit is read from the footer
    for shard, ref in zip(again["shards"], list_shards(plan.input_url, storage_options=plan.storage_options),
                          strict=True):
        assert shard["status"] == "skipped"
        assert shard[field] == read_part_commit(plan.output_url, ref.part_id, plan.output_options)
    assert [s[field] for s in first["shards"]] == [s[field] for s in again["shards"]]


def test_a_shard_names_its_part_by_id_and_file_and_old_manifests_still_read(s3_server, s3_bucket, tiny_model_dir):
    """``part`` is the part's id everywhere (outcomes, Redis, the manifest), ``part_file`` its file.
    A manifest written before ``part_file`` held the file name in ``part``: its readers (the
    finalizer's replaced-part check, the console's samples, the batch service) still find the parts."""
    from jobs.console import read_samples
    from pipeline.publish import check_parts
    from pipeline.shard_outcome import entry_part_file, entry_part_id

    plan = _plan(s3_server, s3_bucket, tiny_model_dir)
    manifest = run_embedded(plan, progress=False)
    refs = list_shards(plan.input_url, storage_options=plan.storage_options)
    assert [(s["part"], s["part_file"]) for s in manifest["shards"]] == [(r.part_id, part_name(r.part_id)) for r in refs]
    assert manifest["parts"] == [part_name(r.part_id) for r in refs]

    old = copy.deepcopy(manifest)
    for entry in old["shards"]:
        entry["part"] = entry.pop("part_file")
    for entry in (*manifest["shards"], *old["shards"]):
        index = entry["index"]
        assert (entry_part_id(entry), entry_part_file(entry)) == (refs[index].part_id, part_name(refs[index].part_id))
    assert {r["id"] for r in read_samples(old, plan.output_options, 4)} == {"s0-r0", "s0-r1", "s1-r0", "s1-r1"}
    commit = _replace_part(plan, 1)
    check_parts(plan, old)
    assert [s["status"] for s in old["shards"]] == ["done", "failed"]
    assert old["shards"][1]["reason"].startswith(REPLACED + commit) and old["parts"] == [part_name(refs[0].part_id)]
