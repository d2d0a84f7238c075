"""Live job state in Redis, written by workers and read by ``job_status`` while a job runs.

Keys (all expire a week after the last write):

- ``tokenmill:job:<id>:meta``    hash: name, kind, output_url, shards, submitted_at, status, ...
- ``tokenmill:job:<id>:shards``  hash: shard index -> JSON {state, url, rows_done, errors,
  output_tokens, reason, worker, started_at, finished_at}
- ``tokenmill:job:<id>:cancel``  set when the job is cancelled

Nothing secret is stored: no storage options, no documents.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis

from pipeline.shard_outcome import ShardOutcome

TTL_S = 7 * 24 * 3600
DEFAULT_STATE_URL = "redis://127.0.0.1:6379/1"


def state_url() -> str:
    """$TOKENMILL_STATE_URL, else the result backend if it is Redis, else the default."""
    explicit = os.environ.get("TOKENMILL_STATE_URL")
    if explicit:
        return explicit
    backend = os.environ.get("TOKENMILL_RESULT_BACKEND", "")
    if backend.startswith(("redis://", "rediss://")):
        return backend
    return DEFAULT_STATE_URL


class JobStateStore:
    def __init__(self, url: str | None = None) -> None:
        self.url = url or state_url()
        self.redis = redis.Redis.from_url(self.url, socket_timeout=10, socket_connect_timeout=5)

    @staticmethod
    def _key(job_id: str, what: str) -> str:
        return f"tokenmill:job:{job_id}:{what}"

    def _touch(self, pipe: Any, job_id: str) -> None:
        for what in ("meta", "shards", "cancel"):
            pipe.expire(self._key(job_id, what), TTL_S)

    # ---- writing ------------------------------------------------------------------------
    def init_job(self, job_id: str, meta: dict[str, Any], shards: list[dict[str, Any]]) -> None:
        """Fresh state for a (re)submitted job: every shard queued, no cancel flag."""
        pipe = self.redis.pipeline()
        for what in ("meta", "shards", "cancel"):
            pipe.delete(self._key(job_id, what))
        pipe.hset(self._key(job_id, "meta"), mapping={k: json.dumps(v) for k, v in meta.items()})
        if shards:
            pipe.hset(
                self._key(job_id, "shards"),
                mapping={str(s["index"]): json.dumps(ShardOutcome.queued_state_dict(s["url"])) for s in shards},
            )
        self._touch(pipe, job_id)
        pipe.execute()

    def set_meta(self, job_id: str, **values: Any) -> None:
        pipe = self.redis.pipeline()
        pipe.hset(self._key(job_id, "meta"), mapping={k: json.dumps(v) for k, v in values.items()})
        self._touch(pipe, job_id)
        pipe.execute()

    def set_shard(self, job_id: str, index: int, state: dict[str, Any]) -> None:
        state = {**state, "updated_at": time.time()}
        pipe = self.redis.pipeline()
        pipe.hset(self._key(job_id, "shards"), str(index), json.dumps(state))
        self._touch(pipe, job_id)
        pipe.execute()

    def cancel(self, job_id: str) -> None:
        pipe = self.redis.pipeline()
        pipe.set(self._key(job_id, "cancel"), "1", ex=TTL_S)
        pipe.hset(self._key(job_id, "meta"), "cancel_requested_at", json.dumps(time.time()))
        pipe.execute()

    # ---- reading ------------------------------------------------------------------------
    def is_cancelled(self, job_id: str) -> bool:
        return bool(self.redis.exists(self._key(job_id, "cancel")))

    def meta(self, job_id: str) -> dict[str, Any]:
        raw = self.redis.hgetall(self._key(job_id, "meta"))
        return {k.decode(): json.loads(v) for k, v in raw.items()}

    def shards(self, job_id: str) -> dict[int, dict[str, Any]]:
        raw = self.redis.hgetall(self._key(job_id, "shards"))
        return {int(k): json.loads(v) for k, v in sorted(raw.items(), key=lambda kv: int(kv[0]))}
