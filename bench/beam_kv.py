"""KV blocks held by beam search: k beams of a 300-token prompt, per step, against a copy of the
prompt's KV per beam (what an engine without shared blocks holds).

    PYTHONPATH=$PWD .venv/bin/python bench/beam_kv.py --out bench/published

Block counts are exact (no timing): the default model, float32, 16-token blocks, prefix caching
off so that a freed block is not counted as held.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sysinfo  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402

DOCUMENT = ("A paged KV cache splits the keys and values of every sequence into fixed-size blocks, so memory is "
            "allocated on demand and almost nothing is wasted. Blocks are found through a block table, and full "
            "blocks can be shared between requests that start with the same tokens. ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", default=None, help="folder for the JSON (default: print only)")
    args = parser.parse_args()
    llm = LLM("smollm2-135m-instruct", dtype="float32", enable_prefix_caching=False, num_kv_blocks=512)
    engine, bm = llm.engine, llm.engine.block_manager
    prompt = (engine.encode("Summarise: " + DOCUMENT * 20))[: args.prompt_tokens]
    prompt_blocks = bm.blocks_for_tokens(len(prompt))
    rows = []
    for k in (1, 2, 4, 8):
        params = SamplingParams(beam_width=k, n=k, max_tokens=args.max_tokens, ignore_eos=True)
        engine.add_request(f"k{k}", prompt, params)
        used = []
        while engine.has_unfinished():
            out = engine.step()
            used.append(bm.num_used_blocks)
        tails = [len(c.token_ids) for c in out[0].outputs]
        copies = k * bm.blocks_for_tokens(len(prompt) + args.max_tokens - 1)  # a whole copy per beam at the end
        rows.append({"beam_width": k, "blocks_after_first_step": used[0], "peak_blocks": max(used),
                     "blocks_per_step": used[:-1], "blocks_with_a_copy_per_beam_at_the_end": copies,
                     "output_tokens": tails})
        print(f"k={k}: {used[0]} blocks after the first step, peak {max(used)}; a copy per beam: {copies}")
    result = {"command": "PYTHONPATH=$PWD .venv/bin/python bench/beam_kv.py --out bench/published",
              "prompt_tokens": len(prompt), "prompt_blocks": prompt_blocks, "block_size": bm.block_size,
              "max_tokens": args.max_tokens, "system": sysinfo.cpu_info(), "rows": rows}
    if args.out:
        path = Path(args.out) / f"beam-kv-{time.strftime('%Y%m%d-%H%M%S')}.json"
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
