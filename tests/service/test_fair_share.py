"""One request cannot starve the live engine (issue 39, hole 3): a request's work is bounded, each
key's share is bounded, and the engine is fed one key's prompt at a time.

No timing is asserted: what is checked is the order things finish in (over HTTP, the engine
holds B's first prompts until A's request is queued, so the order does not hang on load). Key B's prompts each take
32 tokens and key A's one prompt 40; first-come-first-served, A's prompt would enter the engine
after all of B's and finish last.
"""

from __future__ import annotations

import threading

from pipeline_support import tiny_engine, wait_until
from tenant_support import KEY_A, KEY_B, auth, client, settings_for

from engine import SamplingParams
from service.fair_share import ShareLimits
from service.live_engine import LiveEngine, engine_settings
from service.settings import key_id


def test_another_keys_prompt_enters_at_the_next_free_slot(tiny_model_dir):
    live = LiveEngine(engine_settings(str(tiny_model_dir), tiny_engine(tiny_model_dir)))  # a batch of 8
    b_params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    b_calls = [live.submit([[10 + i, 11, 12]] * 2, [b_params] * 2, owner="key-b") for i in range(32)]
    a = live.submit([[7, 8, 9]], [SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)], owner="key-a")
    assert len(a.result(timeout=120)[0].token_ids) == 40
    done_before_a = sum(call.done() for call in b_calls)
    assert done_before_a < len(b_calls) // 2, f"{done_before_a} of key B's {len(b_calls)} calls finished first"
    assert all(len(o.token_ids) == 32 for call in b_calls for o in call.result(timeout=120))


def test_a_short_request_answers_while_another_keys_largest_request_runs(tmp_path, tiny_model_dir):
    engine = {k: v for k, v in tiny_engine(tiny_model_dir).items() if k != "model"}
    c = client(settings_for(tmp_path, model=str(tiny_model_dir), engine_options=engine))
    live = c.app.state.live_engine
    live.share.limits = ShareLimits(request_sequences=64, request_tokens=64 * 64, key_sequences=64)
    huge = {"model": "tiny-test", "prompt": [[1, 2]] * 2048, "n": 128, "max_tokens": 1}
    answer = c.post("/v1/completions", json=huge, headers=auth(KEY_B))
    assert answer.status_code == 400 and answer.json()["error"] == {
        "message": "this request asks for 262144 sequences (prompts x n); the limit is 64",
        "type": "invalid_request_error", "param": "n", "code": "request_too_large"}

    largest = {"model": "tiny-test", "prompt": [[20 + i, 21, 22] for i in range(32)], "n": 2, "max_tokens": 32,
               "temperature": 0}
    b_answer: list = []
    b = threading.Thread(target=lambda: b_answer.append(c.post("/v1/completions", json=largest,
                                                               headers=auth(KEY_B))))
    a_in = threading.Event()
    real_submit, real_turn = live.submit, live._turn

    def submit(prompts, params, listener=None, owner=""):
        future = real_submit(prompts, params, listener, owner=owner)
        if owner == key_id(KEY_A):
            a_in.set()
        return future

    def turn(engine, running):  # B's first prompts are in: hold the engine until A's request is queued
        if running and not a_in.is_set():
            a_in.wait(120)
        real_turn(engine, running)

    live.submit, live._turn = submit, turn
    b.start()
    wait_until(lambda: live.engine is not None and live.engine.has_unfinished(), 120, "key B's request running",
               interval=0.01)
    again = c.post("/v1/completions", json={**largest, "prompt": [[5, 6]], "n": 1}, headers=auth(KEY_B))
    assert again.status_code == 429 and again.json()["error"]["code"] == "rate_limit_exceeded"
    a = c.post("/v1/chat/completions", json={"model": "tiny-test", "max_tokens": 2,
                                             "messages": [{"role": "user", "content": "hi"}]}, headers=auth(KEY_A))
    assert a.status_code == 200, a.text
    assert b.is_alive() and not b_answer  # A answered while B's request still ran
    b.join(120)
    assert b_answer[0].status_code == 200 and len(b_answer[0].json()["choices"]) == 64


def test_the_share_takes_keys_in_turn_and_only_into_free_room():
    from concurrent.futures import Future
    from types import SimpleNamespace

    from service.fair_share import FairShare

    share = FairShare()
    b = SimpleNamespace(future=Future(), n=1)
    a = SimpleNamespace(future=Future(), n=1)
    big = SimpleNamespace(future=Future(), n=16)
    share.push("b", b, 6)
    share.push("a", a, 2)
    share.push("c", big, 1)

    def size(call, _):
        return call.n

    assert share.take(0, 8, size) == []  # a full engine takes nothing
    assert share.take(3, 8, size) == [(b, 0), (a, 0), (b, 1)]  # c's prompt does not fit in 3
    assert share.take(8, 8, size) == [(big, 0)]  # an empty engine takes one prompt larger than its batch
    share.drop(b.future)
    assert share.take(8, 8, size) == [(a, 1)] and share.waiting() == 0
