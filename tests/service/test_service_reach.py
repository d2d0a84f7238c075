"""The service's own storage and the server's files are off limits to ``/v1/jobs`` (issue 23, point 2).

A job that wrote ``_manifest.json`` into ``batches/`` broke ``GET /v1/batches`` for every key,
and one that read ``files/`` read every team's uploads; local paths, ``memory://`` and
``http://`` (the cloud metadata endpoint) reach what the server can reach, not what the team can.
"""

from __future__ import annotations

import pytest
from tenant_support import KEY_A, RecordingRunner, auth, client, settings_for, spec

from jobs.spec import JobSpec
from service.errors import APIError


def _refused(c, body) -> dict:
    answer = c.post("/v1/jobs", json=body, headers=auth(KEY_A))
    assert answer.status_code == 400, answer.text
    return answer.json()["error"]


@pytest.mark.parametrize("where", ["batches", "files/content", "jobs", "files/meta", "", "outputs/batch_1"])
def test_a_job_cannot_read_or_write_the_service_storage(tmp_path, where):
    runner = RecordingRunner()
    c = client(settings_for(tmp_path, allowed_url_prefixes=[str(tmp_path)]), runner)
    inside = str(tmp_path / "storage" / where)
    (tmp_path / "team").mkdir()
    assert _refused(c, spec(str(tmp_path / "team"), inside))["param"] == "output.url"
    assert _refused(c, spec(inside, str(tmp_path / "out")))["code"] == "url_not_allowed"
    assert _refused(c, spec(f"file://{inside}", str(tmp_path / "out")))["param"] == "input.url"
    assert not runner.plans


def test_a_job_cannot_reach_the_storage_from_above_or_through_a_glob_or_a_link(tmp_path):
    c = client(settings_for(tmp_path, allowed_url_prefixes=[str(tmp_path)]))
    (tmp_path / "link").symlink_to(tmp_path / "storage", target_is_directory=True)
    assert "service's own storage" in _refused(c, spec(str(tmp_path), str(tmp_path / "out")))["message"]
    assert _refused(c, spec(str(tmp_path), str(tmp_path / "out"), input={"glob": "*/files/content/*.jsonl"}))
    assert _refused(c, spec(str(tmp_path / "link" / "files"), str(tmp_path / "out")))["param"] == "input.url"
    assert _refused(c, spec(str(tmp_path / "team"), str(tmp_path / "a" / ".." / "storage")))


def test_an_s3_storage_is_as_closed_as_a_local_one(tmp_path):
    policy = settings_for(tmp_path, storage_url="s3://tokenmill-svc/state").spec_policy()

    def refused(input_url: str, output_url: str) -> str:
        with pytest.raises(APIError) as caught:
            policy.check(JobSpec.from_dict(spec(input_url, output_url)))
        assert caught.value.code == "url_not_allowed"
        return caught.value.param

    assert refused("s3://tokenmill-svc/state/files/content/", "s3://team/out/") == "input.url"
    assert refused("s3a://tokenmill-svc/state/files/", "s3://team/out/") == "input.url"
    assert refused("s3://team/in/", "s3://tokenmill-svc//state/batches/") == "output.url"
    assert refused("s3://tokenmill-svc/", "s3://team/out/") == "input.url"
    policy.check(JobSpec.from_dict(spec("s3://tokenmill-svc/other/", "s3://team/out/")))


@pytest.mark.parametrize("url", ["/etc", "file:///etc/", "memory://shared/in/", "http://169.254.169.254/latest/",
                                 "https://example.com/data.jsonl", "simplecache::s3://team/in/"])
def test_without_allowed_prefixes_only_object_stores_are_accepted(tmp_path, url):
    error = _refused(client(settings_for(tmp_path)), spec(url, "s3://team/out/"))
    assert (error["param"], error["code"]) == ("input.url", "url_not_allowed")


def test_allowed_prefixes_confine_every_url_a_spec_names(tmp_path):
    c = client(settings_for(tmp_path, allowed_url_prefixes=["s3://team-a/", str(tmp_path / "shared")]))
    assert c.post("/v1/jobs", json=spec("s3://team-a/in/", str(tmp_path / "shared" / "out")),
                  headers=auth(KEY_A)).status_code == 200
    assert "outside the prefixes" in _refused(c, spec("s3://team-b/in/", "s3://team-a/out/"))["message"]
    assert _refused(c, spec("s3://team-a-other/in/", "s3://team-a/out/"))["param"] == "input.url"
    assert _refused(c, spec("s3://team-a/in/", str(tmp_path / "elsewhere")))["param"] == "output.url"
    assert _refused(c, spec("s3://team-a/in/", "s3://team-a/out/", model={"path": "/etc"}))["param"] == "model.path"
    schema_file = spec("s3://team-a/in/", "s3://team-a/out/", kind="extract", extract={"schema_file": "/etc/passwd"})
    assert _refused(c, schema_file)["param"] == "extract.schema_file"


def test_engine_settings_are_the_operators(tmp_path):
    """A team cannot size a worker's memory: kv_cache_memory_gb = 1000 would kill each worker it reached."""
    c = client(settings_for(tmp_path, engine_options={"num_threads": 1, "max_num_seqs": 8}))
    error = _refused(c, spec("s3://team/in/", "s3://team/out/", model={"kv_cache_memory_gb": 1000}))
    assert (error["param"], error["code"]) == ("model.kv_cache_memory_gb", "setting_not_allowed")
    assert _refused(c, spec("s3://team/in/", "s3://team/out/", model={"max_num_seqs": 512}))["message"] == (
        "model.max_num_seqs: engine settings are the operator's (--engine-options; here 8); leave it out or "
        "give the same value")
    same = spec("s3://team/in/", "s3://team/out/", model={"num_threads": 1, "max_num_seqs": 8})
    assert c.post("/v1/jobs", json=same, headers=auth(KEY_A)).status_code == 200
