"""docker-compose.gpu.yml: one worker over two GPUs, as private to the broker as the others."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from engine import EngineConfig

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "${REDIS_PASSWORD:?set REDIS_PASSWORD}"


def test_the_two_gpu_worker_runs_one_two_rank_engine():
    worker = yaml.safe_load((REPO / "docker-compose.gpu.yml").read_text())["services"]["worker-tp2"]
    assert "ports" not in worker and "network_mode" not in worker
    env = worker["environment"]
    for key in ("TOKENMILL_BROKER_URL", "TOKENMILL_RESULT_BACKEND"):
        assert env[key].startswith(f"redis://:{PASSWORD}@redis:6379/")
    assert env["TOKENMILL_QUEUE"] == "tokenmill-tp2"  # single-GPU workers never take its shards
    [devices] = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices["device_ids"] == ["0", "1"]
    settings = json.loads(env["TOKENMILL_PRELOAD_ENGINE"].replace("${TP_MODEL:?set TP_MODEL to a model "
                                                                  "directory under ./models}", "/models/m"))
    assert EngineConfig(**settings).tensor_parallel_size == 2
