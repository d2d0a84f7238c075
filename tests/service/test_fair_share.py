"""One request cannot starve the live engine (issue 39, hole 3): a request's work is bounded, each
key's share is bounded, and the engine is fed one key's prompt at a time.

No timing is asserted: what is checked is the order things finish in. Key B's prompts each take
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


def test_another_keys_prompt_enters_at_the_next_free_slot(tiny_model_dir):
    live = LiveEngine(engine_settings(str(tiny_model_dir), tiny_engine(tiny_model_dir)))  # a batch of 8
    b_params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    b_calls = [live.submit([[10 + i, 11, 12]] * 2, [b_params] * 2, "key-b") for i in range(32)]
    wait_until(lambda: live.engine is not None and live.engine.has_unfinished(), 120, "key B's prompts running",
               interval=0.002)
    a = live.submit([[7, 8, 9]], [SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)], "key-a")
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
    b.start()
    wait_until(lambda: live.engine is not None and live.engine.has_unfinished(), 120, "key B's request running",
               interval=0.002)
    again = c.post("/v1/completions", json={**largest, "prompt": [[5, 6]], "n": 1}, headers=auth(KEY_B))
    assert again.status_code == 429 and again.json()["error"]["code"] == "rate_limit_exceeded"
    a = c.post("/v1/chat/completions", json={"model": "tiny-test", "max_tokens": 2,
                                             "messages": [{"role": "user", "content": "hi"}]}, headers=auth(KEY_A))
    assert a.status_code == 200, a.text
    assert b.is_alive() and not b_answer  # A answered while B's request still ran
    b.join(120)
    assert b_answer[0].status_code == 200 and len(b_answer[0].json()["choices"]) == 64
