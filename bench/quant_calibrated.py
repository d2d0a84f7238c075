"""Calibrated quantized checkpoints, written the way teams get them: llm-compressor's GPTQ for
4-bit W4A16 (group-wise, with activation ordering) and SmoothQuant + GPTQ for int8 W8A8,
calibrated on a small offline English text set.

``llmcompressor`` pins an older transformers and compressed-tensors than tokenmill's, so it is
not a tokenmill dependency: run this file with a separate environment that has it (a tool for
making checkpoints, like the compressor a team runs before handing tokenmill the folder), then
measure the folders with ``bench/bench_quantized.py --extra NAME=FOLDER``:

    python -m venv /tmp/lcvenv && /tmp/lcvenv/bin/pip install llmcompressor==0.14.0.1
    /tmp/lcvenv/bin/python bench/quant_calibrated.py --src ~/.cache/tokenmill/models/smollm2-135m-instruct

Calibration text (``calibration_text``): CPython's pydoc topics and the Apache-2.0 and MPL-2.0
licence texts, none of which overlaps the held-out GPL-3 text that the perplexity is measured on.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from pathlib import Path

COPIED = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
LICENCES = ("/usr/share/common-licenses/Apache-2.0", "/usr/share/common-licenses/MPL-2.0")


def calibration_text() -> list[str]:
    """Offline English documents disjoint from the held-out GPL-3 (no GPL/LGPL/GFDL text)."""
    import pydoc_data.topics as topics

    docs = [t for t in topics.topics.values() if len(t) > 500]
    return docs + [Path(p).read_text() for p in LICENCES]


def calibration_set(tokenizer, samples: int, seq_len: int, seed: int = 0):
    """``samples`` windows of ``seq_len`` tokens cut from the concatenated documents, shuffled."""
    from datasets import Dataset

    ids: list[int] = []
    for doc in calibration_text():
        ids += tokenizer(doc)["input_ids"] + [tokenizer.eos_token_id]
    windows = [ids[i:i + seq_len] for i in range(0, len(ids) - seq_len, seq_len)]
    random.Random(seed).shuffle(windows)
    windows = windows[:samples]
    return Dataset.from_dict({"input_ids": windows, "attention_mask": [[1] * seq_len for _ in windows]}), len(ids)


def recipe(name: str):
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier

    ignore = ["lm_head"]
    if name == "w8a8-sq-gptq":
        return [SmoothQuantModifier(smoothing_strength=0.8), GPTQModifier(targets="Linear", scheme="W8A8", ignore=ignore)]
    if name == "w8a8-sq-gptq-head":  # lm_head quantized too (not ignored)
        return [SmoothQuantModifier(smoothing_strength=0.8), GPTQModifier(targets="Linear", scheme="W8A8", ignore=[])]
    if name == "w8a8-rtn":
        return [QuantizationModifier(targets="Linear", scheme="W8A8", ignore=ignore)]
    if name.startswith("w4a16-gptq-"):  # w4a16-gptq-g64-weight, w4a16-gptq-g32-asym-weight
        parts = name.split("-")
        group, actorder = int(parts[2][1:]), parts[-1]
        scheme = {"num_bits": 4, "type": "int", "symmetric": "asym" not in parts, "strategy": "group",
                  "group_size": group, "actorder": actorder}
        return [GPTQModifier(config_groups={"group_0": {"targets": ["Linear"], "weights": scheme}}, ignore=ignore)]
    raise ValueError(f"unknown variant {name}")


def make(src: Path, out: Path, name: str, samples: int, seq_len: int) -> dict:
    import torch
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    data, total = calibration_set(tokenizer, samples, seq_len)
    start = time.perf_counter()
    oneshot(model=model, dataset=data, recipe=recipe(name), num_calibration_samples=len(data),
            max_seq_length=seq_len, shuffle_calibration_samples=False)
    seconds = time.perf_counter() - start
    model.save_pretrained(out, save_compressed=True)
    for f in COPIED:
        if (src / f).is_file():
            shutil.copy(src / f, out / f)
    info = {"variant": name, "calibration_samples": len(data), "seq_len": seq_len, "calibration_tokens": len(data) * seq_len,
            "calibration_pool_tokens": total, "seconds": round(seconds, 1), "torch_threads": torch.get_num_threads()}
    (out / "calibration.json").write_text(json.dumps(info, indent=1))
    return info


def make_tiny(out: Path, name: str, tokenizer_from: Path) -> None:
    """The test fixture (tests/data/): a 2-layer random Llama, 512-token vocabulary, bfloat16
    float parts, calibrated on random token ids, so the real GPTQ output is small enough to keep."""
    import torch
    from llmcompressor import oneshot
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=512, max_position_embeddings=256, initializer_range=0.2,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out / "float")
    model = LlamaForCausalLM.from_pretrained(out / "float", dtype=torch.bfloat16)
    ids = torch.randint(3, 512, (32, 64)).tolist()
    from datasets import Dataset

    data = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * 64 for _ in ids]})
    oneshot(model=model, dataset=data, recipe=recipe(name), num_calibration_samples=len(ids), max_seq_length=64,
            tokenizer=AutoTokenizer.from_pretrained(tokenizer_from))  # only asked for, the data is token ids
    model.save_pretrained(out / name, save_compressed=True)
    shutil.rmtree(out / "float")


def main() -> None:
    import llmcompressor

    ap = argparse.ArgumentParser()
    ap.add_argument("--src", type=Path, default=Path.home() / ".cache/tokenmill/models/smollm2-135m-instruct")
    ap.add_argument("--root", type=Path, default=Path.home() / ".cache/tokenmill/quantized")
    ap.add_argument("--variants", default="w8a8-sq-gptq,w4a16-gptq-g64-weight,w4a16-gptq-g32-weight")
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--tiny", type=Path, help="write the tiny test fixture of each variant under this folder")
    args = ap.parse_args()
    if args.tiny:
        for name in args.variants.split(","):
            make_tiny(args.tiny, name, args.src)
        return
    for name in args.variants.split(","):
        out = args.root / f"{args.src.name}-{name}"
        if (out / "calibration.json").is_file():
            continue
        info = make(args.src, out, name, args.samples, args.seq_len)
        print(json.dumps({**info, "llmcompressor": llmcompressor.__version__, "folder": str(out)}), flush=True)


if __name__ == "__main__":
    main()
