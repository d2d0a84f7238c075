"""HF reference outputs kept on disk between test runs, under a key of everything that decides them.

The HF reference decodes one prompt at a time (its definition: no padding, no batch), which on a
small CPU reads every weight once per token: about a minute for the default model's chat prompts,
where the engine needs seconds. That output is a pure function of the model's files, the request
(prompts, token count, dtype), the transformers and torch versions and the CPU, so it is computed
once per such key and read back afterwards; any change to one of them is a new key, computed anew.

Files live in ``$TOKENMILL_CACHE/hf-references`` (default ``~/.cache/tokenmill``, next to the
cached model). ``TOKENMILL_HF_REFERENCE_CACHE=0`` recomputes every reference and stores nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV_SWITCH = "TOKENMILL_HF_REFERENCE_CACHE"


def cache_root() -> Path:
    from engine.model_registry import cache_dir

    return cache_dir() / "hf-references"


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def model_digest(model_dir: Path) -> dict[str, str]:
    """sha256 of every file of the model folder (weights, config, tokenizer), by name."""
    out = {}
    for p in sorted(Path(model_dir).iterdir()):
        if p.is_file():
            out[p.name] = _file_digest(p)
    return out


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor()


def reference_key(model_dir: Path, request: dict[str, Any]) -> dict[str, Any]:
    """Everything the reference's output depends on."""
    import torch
    import transformers

    return {
        "model": model_digest(model_dir),
        "request": request,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu": _cpu(),
        "machine": platform.machine(),
    }


def cached_reference(model_dir: Path, request: dict[str, Any], compute: Callable[[], Any]) -> Any:
    """``compute()``'s result for this model and request: read back if an earlier run stored it
    under the same key, otherwise computed and stored (JSON-able results only)."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return compute()
    key = reference_key(model_dir, request)
    blob = json.dumps(key, sort_keys=True)
    path = cache_root() / f"{hashlib.sha256(blob.encode()).hexdigest()}.json"
    try:
        stored = json.loads(path.read_text())
        if stored["key"] == json.loads(blob):
            return stored["result"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent or unreadable: computed again below
    result = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": json.loads(blob), "result": result}))
    os.replace(tmp, path)
    return result
