"""The completions routes' engine thread: prompts of concurrent calls run in the same steps, and
a prompt the engine refuses fails its own call only."""

from __future__ import annotations

import pytest
from pipeline_support import tiny_engine

from engine import RequestError, SamplingParams
from service.live_engine import LiveEngine, engine_settings


def test_calls_share_steps_and_fail_alone(tiny_model_dir):
    live = LiveEngine(engine_settings(str(tiny_model_dir), tiny_engine(tiny_model_dir)))
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    first = live.submit([[10, 11, 12], [13, 14]], [params] * 2)
    bad = live.submit([[20, 21], [49152]], [params] * 2)
    second = live.submit([[30, 31, 32, 33]], [params])
    assert [len(o.token_ids) for o in first.result(timeout=120)] == [6, 6]
    assert len(second.result(timeout=120)[0].token_ids) == 6
    with pytest.raises(RequestError, match="outside the vocabulary"):
        bad.result(timeout=120)
    stats = live.engine.stats()
    assert stats["peak_running_seqs"] == 3  # both good calls' prompts in the same steps
    assert not live.engine.has_unfinished()  # the refused call's first prompt was withdrawn


def test_a_busy_spell_keeps_older_objects_from_the_collector_until_idle(tiny_model_dir):
    """From the first call to the next idle wait the heap is frozen (engine/host.py): garbage made
    before survives a collection then, and is collected once the engine thread is idle."""
    import gc
    import weakref

    from pipeline_support import wait_until

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    from pipeline.engine_cache import clear_engine_cache

    clear_engine_cache()  # a worker's cached engine (an earlier test's) keeps the heap frozen
    wait_until(lambda: gc.get_freeze_count() == 0, 60, "earlier live engines idle")
    live = LiveEngine(engine_settings(str(tiny_model_dir), tiny_engine(tiny_model_dir)))
    params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
    gc.disable()  # no automatic collection takes the garbage before the engine thread freezes it
    try:
        older = weakref.ref(Cycle())
        running = live.submit([[10, 11, 12]] * 4, [params] * 4)
        wait_until(lambda: gc.get_freeze_count() > 0 or running.done(), 120, "the busy spell frozen",
                   interval=0.005)
        assert not running.done()  # (else the spell ended before it was seen: not what this test checks)
        gc.collect()
        assert older() is not None
    finally:
        gc.enable()
    assert [len(o.token_ids) for o in running.result(timeout=120)] == [400] * 4
    wait_until(lambda: gc.get_freeze_count() == 0, 60, "the heap thawed once idle")
    gc.collect()
    assert older() is None
