"""Write a tuned launch into engine/attention/triton_backend.py as the tree's default, on the GPU
machine between tuning and testing (issue26_decode_call.sh, issue26_extend_call.sh).

    python3 bench/gpu/set_default_launch.py DEFAULT_DECODE DecodeLaunch '{"block_n": 128, ...}'
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

BACKEND = Path(__file__).resolve().parents[2] / "engine" / "attention" / "triton_backend.py"


def main() -> None:
    name, cls, fields = sys.argv[1:4]
    args = ", ".join(f"{k}={v}" for k, v in json.loads(fields).items())
    text = BACKEND.read_text()
    text, n = re.subn(rf"^{name} = {cls}\(.*\)$", f"{name} = {cls}({args})", text, flags=re.M)
    if n != 1:
        raise SystemExit(f"{name} = {cls}(...) not found once in {BACKEND}")
    BACKEND.write_text(text)


if __name__ == "__main__":
    main()
