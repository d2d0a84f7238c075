"""The process's cached engine: built once, its start-up objects frozen out of the garbage
collector's walks, and given back in full when it is replaced."""

from __future__ import annotations

import gc
import weakref

from pipeline_support import tiny_engine

from pipeline import engine_cache


def test_a_replaced_engine_is_collected_and_the_new_one_frozen(tiny_model_dir) -> None:
    engine_cache.clear_engine_cache()
    assert gc.get_freeze_count() == 0
    first = engine_cache.get_engine(tiny_engine(tiny_model_dir))
    assert engine_cache.get_engine(tiny_engine(tiny_model_dir)) is first  # same settings: reused
    frozen = gc.get_freeze_count()
    assert frozen > 10_000  # torch, transformers, the model: out of every collection's walk
    gone = weakref.ref(first)
    first.runner.self_cycle = first.runner  # even an engine caught in a cycle comes back
    del first
    second = engine_cache.get_engine(tiny_engine(tiny_model_dir, max_num_seqs=4))
    assert gone() is None
    assert second.config.max_num_seqs == 4 and gc.get_freeze_count() > 10_000
    engine_cache.clear_engine_cache()
    assert gc.get_freeze_count() == 0
