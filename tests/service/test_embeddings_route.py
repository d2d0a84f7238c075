"""``POST /v1/embeddings`` of a live ``tokenmill serve`` through the stock ``openai`` client: its
default base64 answer and ``encoding_format="float"`` give ``LLM.embed``'s vectors for texts
and token ids, ``dimensions`` truncates and renormalises, and a bad input is one clear 400; and
a Batch API file of ``/v1/embeddings`` lines gives the same vectors."""

from __future__ import annotations

import json

import numpy as np
import openai
import pytest
from pipeline_support import tiny_engine
from service_stack import MODEL_NAME, free_port, wait_for
from test_service_embedded import _serve
from transformers import AutoTokenizer

from engine import LLM

KEY = "sk-embeddings-test"
TEXTS = ["The quick brown fox", "Numbers: one, two, three,", "A third, longer sentence about the Moon and tides."]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    port = free_port()
    proc = _serve(tmp_path_factory.mktemp("embeddings"), tiny_model_dir, port, KEY, "serve.log")
    yield proc, port
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server[1]}/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = [tok(t)["input_ids"] for t in TEXTS]
    llm = LLM(str(tiny_model_dir), **{k: v for k, v in tiny_engine(tiny_model_dir).items() if k != "model"})
    return ids, [o.embedding for o in llm.embed(ids)], [o.embedding for o in llm.embed(ids, dimensions=16)]


def test_texts_and_token_ids_in_both_encodings(client, reference):
    ids, full, short = reference
    for given, fmt in ((TEXTS, openai.NOT_GIVEN), (ids, "float"), (TEXTS, "base64")):
        out = client.embeddings.create(model=MODEL_NAME, input=given, encoding_format=fmt)
        assert out.object == "list" and out.model == MODEL_NAME
        assert [d.index for d in out.data] == [0, 1, 2]
        assert out.usage.prompt_tokens == out.usage.total_tokens == sum(map(len, ids))
        if fmt == "base64":  # the client hands base64 back as it came when asked for it explicitly
            got = [np.frombuffer(__import__("base64").b64decode(d.embedding), "<f4") for d in out.data]
        else:
            got = [np.array(d.embedding, np.float32) for d in out.data]
        for g, want in zip(got, full, strict=True):
            np.testing.assert_allclose(g, want, atol=1e-6)
    one = client.embeddings.create(model=MODEL_NAME, input=TEXTS[1], dimensions=16)
    assert len(one.data) == 1 and len(one.data[0].embedding) == 16
    np.testing.assert_allclose(np.array(one.data[0].embedding, np.float32), short[1], atol=1e-6)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"input": ["ok", ""]}, "input[1]: empty input"),
    ({"input": [[5, 6], [10**9]]}, "prompt has token ids outside the vocabulary [0, 49152)"),
    ({"input": "x", "dimensions": 65}, "invalid pooling parameters: dimensions must be at most the model's 64, got 65"),
    ({"input": "x", "model": "other"}, "The model 'other' does not exist; this server serves"),
])
def test_bad_requests_are_one_clear_error(client, kwargs, message):
    with pytest.raises((openai.BadRequestError, openai.NotFoundError)) as info:
        client.embeddings.create(**{"model": MODEL_NAME, **kwargs})
    assert message in info.value.body["message"]


def test_a_batch_of_embedding_lines(server, client, reference):
    ids, full, short = reference
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": MODEL_NAME, "input": text, **({"dimensions": 16} if i == 1 else {})}}
             for i, text in enumerate(TEXTS)]
    upload = client.files.create(file=("e.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode()),
                                 purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")

    def finished():
        server[0].check()
        b = client.batches.retrieve(batch.id)
        return b if b.status in ("completed", "failed") else None

    done = wait_for(finished, 180, "the embeddings batch", interval=0.3)
    assert done.status == "completed" and done.request_counts.completed == 3, done.errors
    out = {x["custom_id"]: x["response"]["body"] for x in map(json.loads, client.files.content(done.output_file_id)
                                                               .text.splitlines())}
    for i, want in enumerate((full[0], short[1], full[2])):
        np.testing.assert_allclose(np.array(out[f"c{i}"]["data"][0]["embedding"], np.float32), want, atol=1e-5)
