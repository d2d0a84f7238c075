"""What streaming costs a live request: the same completion asked for plainly and with
``stream=True``, in alternating pairs against one ``tokenmill serve`` subprocess (the stock
``openai`` client here, the server in its own process as a user runs it), on the tiny
random-weight test model so a pair takes well under a second: a step is a few milliseconds, so
the per-token cost of streaming shows at its largest. Reports the median per-pair ratio of end-to-end times (streamed / plain) and the
streamed requests' median time to the first text, against the plain ones' whole answer.

    PYTHONPATH=$PWD python bench/bench_streaming.py --pairs 15 --max-tokens 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests/service")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    import httpx2 as httpx
    import openai
    from model_fixtures import build_tiny_llama
    from pipeline_support import wait_until
    from service_stack import MODEL_NAME, free_port
    from test_service_embedded import _serve

    from bench.sysinfo import cpu_info, describe
    from engine.model_registry import resolve_model

    info = cpu_info()
    print(describe(info))
    tmp = Path(tempfile.mkdtemp())
    model = build_tiny_llama(tmp / "tiny", resolve_model("smollm2-135m-instruct"))
    key = "sk-bench"
    port = free_port()
    server = _serve(tmp, model, port, key, "serve.log")
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: httpx.get(f"{url}/readyz", timeout=5).status_code == 200, 120, "ready")
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)
        ask = {"model": MODEL_NAME, "prompt": "The quick brown fox", "max_tokens": args.max_tokens,
               "temperature": 0}
        plain_s, stream_s, first_s = [], [], []
        for i in range(args.pairs + 1):
            t = time.perf_counter()
            plain = client.completions.create(**ask)
            plain_time = time.perf_counter() - t
            t, first, text = time.perf_counter(), None, ""
            for chunk in client.completions.create(**ask, stream=True):
                if first is None and chunk.choices and chunk.choices[0].text:
                    first = time.perf_counter() - t
                text += "".join(c.text for c in chunk.choices)
            stream_time = time.perf_counter() - t
            assert text == plain.choices[0].text
            if i:  # the first pair warms the client and the tokenizer
                plain_s.append(plain_time)
                stream_s.append(stream_time)
                first_s.append(first)
    finally:
        server.stop()
    ratios = [s / p for s, p in zip(stream_s, plain_s, strict=True)]
    result = {
        "command": f"PYTHONPATH=$PWD python bench/bench_streaming.py --pairs {args.pairs} "
                   f"--max-tokens {args.max_tokens}",
        "system": info, "pairs": args.pairs, "max_tokens": args.max_tokens,
        "median_plain_s": statistics.median(plain_s), "median_stream_s": statistics.median(stream_s),
        "median_stream_first_text_s": statistics.median(first_s),
        "median_pair_ratio_stream_over_plain": statistics.median(ratios),
    }
    print(json.dumps(result, indent=2))
    out = REPO / "bench/published" / f"streaming-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
