"""Compile time of hostile structured-output constraints with xgrammar (issue 39, point 6).

Each constraint compiles in its own child process (address space capped at 6 GiB, 40 s limit),
with the served model's tokenizer, as ``engine/structured_output.py`` compiles it. Prints one
JSON document: the CPU flags, the load average and, per case, seconds, peak RSS and whether
``engine/constraint_size.py`` now refuses it before any compile.

    python bench/probe_grammar_compile.py [MODEL_DIR] > bench/published/grammar-compile-probe-<date>.json
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

CASES = [
    ("json", {"type": "string"}),
    ("json", {"type": "string", "maxLength": 100}),
    ("json", {"type": "string", "maxLength": 1000}),
    ("json", {"type": "string", "maxLength": 10_000_000}),
    ("json", {"type": "array", "items": {"type": "string", "maxLength": 1000}, "maxItems": 1000}),
    ("json", {"type": "string", "pattern": "^[a-z]{8000}$"}),
    ("regex", "(a{1,1000}){1,1000}"),
]
CHILD = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
import xgrammar as xgr
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
comp = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok)), max_threads=1,
                           cache_enabled=False)
kind, text = sys.argv[2], sys.argv[3]
start = time.monotonic()
(comp.compile_json_schema(text, any_whitespace=False) if kind == "json" else comp.compile_regex(text))
print(json.dumps({"s": round(time.monotonic() - start, 2),
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))
"""


def main() -> None:
    from engine.structured_output import StructuredOutput

    model = sys.argv[1] if len(sys.argv) > 1 else str(Path.home() / ".cache/tokenmill/models/smollm2-135m-instruct")
    flags = sorted(set(re.findall(r"\b(avx\S*|amx\S*)", Path("/proc/cpuinfo").read_text())))
    rows = []
    for kind, value in CASES:
        text = value if isinstance(value, str) else json.dumps(value)
        try:
            StructuredOutput(**{kind: value})
            refused = None
        except ValueError as exc:
            refused = str(exc)
        try:
            done = subprocess.run([sys.executable, "-c", CHILD, model, kind, text], capture_output=True, text=True,
                                  timeout=40)
            result = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {
                "error": done.stderr.strip().splitlines()[-1][:200]}
        except subprocess.TimeoutExpired:
            result = {"s": ">40"}
        rows.append({"kind": kind, "constraint": text, "chars": len(text), **result, "refused_now": refused})
    print(json.dumps({"command": " ".join(["python", *sys.argv]), "cpu_flags": flags,
                      "loadavg": os.getloadavg(), "cases": rows}, indent=1))


if __name__ == "__main__":
    main()
