"""The pipeline tests' shared place: the same job on a local folder and on S3 (moto).
``test_checkpoints.py`` keeps its own ``where``, with SeaweedFS as a third place."""

from __future__ import annotations

from pathlib import Path

import pytest
from pipeline_support import Where


@pytest.fixture(params=["local", "moto"])
def where(request, tmp_path: Path) -> Where:
    if request.param == "local":
        (tmp_path / "in").mkdir()
        return Where(str(tmp_path / "in"), str(tmp_path / "out"), {})
    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    return Where(f"s3://{bucket}/in", f"s3://{bucket}/out", server.storage_options, server.client())
