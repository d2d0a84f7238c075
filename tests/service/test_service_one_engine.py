"""An embedded ``tokenmill serve`` holds one engine (issue 43): its live routes and its batches
share it, through the stock ``openai`` client. A live chat streams while a batch runs, and is
finished before the batch is; the batch's answers are those of a batch run alone."""

from __future__ import annotations

import json

import openai
from live_server import live_server
from pipeline_support import wait_until
from service_stack import MODEL_NAME, chat_line, jsonl

from engine import LLMEngine
from pipeline.engine_cache import clear_engine_cache

KEY = "sk-one-engine"


def _batch(c: openai.OpenAI, lines: list[dict]) -> str:
    upload = c.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    return c.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h").id


def _answers(c: openai.OpenAI, batch_id: str) -> dict[str, tuple[str, int]]:
    done = wait_until(lambda: (b := c.batches.retrieve(batch_id)).status in ("completed", "failed") and b,
                      300, "the batch", interval=0.3)
    assert done.status == "completed" and done.request_counts.failed == 0, done.errors
    answers = {}
    for line in c.files.content(done.output_file_id).text.splitlines():
        body = json.loads(line)["response"]["body"]
        answers[json.loads(line)["custom_id"]] = (body["choices"][0]["message"]["content"],
                                                  body["usage"]["completion_tokens"])
    return answers


def test_an_embedded_server_loads_the_model_once_for_live_calls_and_batches(tmp_path, tiny_model_dir, monkeypatch):
    clear_engine_cache()  # an earlier test's cached engine would serve the batch without a build
    built: list[str] = []
    real_init = LLMEngine.__init__

    def counted(self: LLMEngine, config) -> None:
        built.append(str(config.model))
        real_init(self, config)

    monkeypatch.setattr(LLMEngine, "__init__", counted)
    lines = [chat_line(f"b-{i}", f"Tell me about number {i}", max_tokens=48) for i in range(48)]
    for line in lines:
        line["body"]["ignore_eos"] = True  # every line its 48 tokens: 6 rounds of 8 sequences
    ask = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 8, "temperature": 0}
    with live_server(tmp_path, tiny_model_dir, KEY, embedded=True) as server:
        wait_until(lambda: server.live.ready or server.live.load_error, 120, "the live engine")
        c = openai.OpenAI(api_key=KEY, base_url=f"{server.url}/v1", max_retries=0, timeout=120)
        alone = c.chat.completions.create(**ask).choices[0].message.content
        solo = _answers(c, _batch(c, lines))  # no live traffic

        engines = server.live.engines
        beside = _batch(c, lines)

        def jobs() -> list:
            return [v for v in engines.views if v.owner.startswith("job") and v.ids]

        wait_until(jobs, 120, "the batch's rows in the engine", interval=0.02)
        chunks = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(**ask, stream=True)
                  if ch.choices]
        assert jobs()  # the batch still has rows in the engine: the live chat did not wait for it
        assert "".join(chunks) == alone
        assert c.batches.retrieve(beside).status == "in_progress"
        assert _answers(c, beside) == solo  # token-equal to the batch run alone
    assert built == [str(tiny_model_dir)]  # one engine: the live routes' and both batches'
    assert engines.builds == 1
