"""One engine per process, built from a plan's engine settings and reused.

Loading weights and allocating the KV pool take seconds; a worker serves many shards
of the same job (and usually the same settings across jobs), so the engine is kept.
Only one engine is held at a time: a plan with other settings replaces it, which
bounds memory on a worker that sees several models.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from engine import EngineConfig, LLMEngine
from engine.host import freeze_startup_objects, release_frozen_objects

log = logging.getLogger(__name__)

_lock = threading.Lock()
_engine: LLMEngine | None = None
_key: str | None = None


def engine_key(settings: dict[str, Any]) -> str:
    return json.dumps(settings, sort_keys=True, default=str)


def get_engine(settings: dict[str, Any]) -> LLMEngine:
    """The process's engine for these settings, building it on first use."""
    global _engine, _key
    key = engine_key(settings)
    with _lock:
        if _engine is None or _key != key:
            if _engine is not None:
                log.info("engine settings changed; replacing the engine")
                _engine.close()  # a tensor-parallel engine's ranks hold their devices until they exit
            _engine, _key = None, None
            release_frozen_objects()
            started = time.perf_counter()
            engine = LLMEngine(EngineConfig(**settings))
            warm_up(engine)
            freeze_startup_objects()  # the engine's steps no longer pay for walking these
            _engine, _key = engine, key
            log.info("engine built and warmed for %s in %.1f s (%s)", settings.get("model"),
                     time.perf_counter() - started, threading.current_thread().name)
        return _engine


def warm_up(engine: LLMEngine) -> None:
    """Run a few short requests so one-time costs (kernel compilation, allocator growth) are
    paid at start-up, not inside the first shard, where they would count against the
    broker's visibility timeout. Batch of 3 with multi-block contexts: sizes 0/1 would
    specialise compiled shapes."""
    block = engine.config.block_size
    for i, length in enumerate((2 * block + 1, 3 * block + 5, block + 3)):
        prompt = [(7 + 13 * i + t) % 1000 + 10 for t in range(min(length, engine.max_model_len - 8))]
        engine.add_request(f"warmup-{i}", prompt, {"max_tokens": 4, "temperature": 0.0, "ignore_eos": True})
    while engine.has_unfinished():
        engine.step()


def rebuild_engine(settings: dict[str, Any]) -> LLMEngine:
    """Throw the cached engine away and build a fresh one (after repeated step faults)."""
    clear_engine_cache()
    return get_engine(settings)


def clear_engine_cache() -> None:
    global _engine, _key
    with _lock:
        if _engine is not None:
            _engine.close()
        _engine, _key = None, None
        release_frozen_objects()  # under the lock: a get_engine beside it may be freezing its own
