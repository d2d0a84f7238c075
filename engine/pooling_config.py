"""The pooling a model folder asks for, read from its sentence-transformers files.

``modules.json`` lists the modules; a ``sentence_transformers.models.Pooling`` entry points at
a folder (usually ``1_Pooling``) whose ``config.json`` names the mode, and a ``Normalize``
entry means the vectors are unit length. Without them a decoder model pools its last token
(Qwen3-Embedding, e5-mistral and the like are trained so) and normalises, as vLLM does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# sentence-transformers' Pooling config flags -> our modes, in the order they are tried
_MODES = (("pooling_mode_lasttoken", "last"), ("pooling_mode_mean_tokens", "mean"), ("pooling_mode_cls_token", "cls"))


@dataclass(frozen=True)
class ModelPooling:
    """A model's own pooling mode and whether its vectors are normalised."""

    pooling: str = "last"
    normalize: bool = True


def model_pooling(model_dir: Path) -> ModelPooling:
    """The folder's pooling, or the default when it has no sentence-transformers files. A file
    that is there but unreadable is an error naming it, never a silent default."""
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        return ModelPooling()
    try:
        modules = json.loads(modules_file.read_text())
        pooling, normalize = "last", False
        for module in modules:
            module_type = str(module.get("type", ""))
            if module_type.endswith(".Normalize"):
                normalize = True
            elif module_type.endswith(".Pooling"):
                flags = json.loads((model_dir / module.get("path", "") / "config.json").read_text())
                pooling = next((mode for key, mode in _MODES if flags.get(key)), None)
                if pooling is None:
                    raise ValueError(f"no pooling mode tokenmill runs ({', '.join(k for k, _ in _MODES)})")
        return ModelPooling(pooling, normalize)
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"cannot read the pooling of {model_dir} from modules.json: {e}") from None
