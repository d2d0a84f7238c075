"""HF ``architectures`` name -> the engine's model class. Adding a family is one file under
``engine/models/`` and one line here."""

from __future__ import annotations

from engine.model_errors import UnsupportedArchitecture
from engine.models.decoder import CausalLM
from engine.models.gemma3 import Gemma3ForCausalLM
from engine.models.llama import LlamaForCausalLM
from engine.models.mixtral import MixtralForCausalLM
from engine.models.phi3 import Phi3ForCausalLM
from engine.models.qwen3 import Qwen3ForCausalLM
from engine.models.qwen3_moe import Qwen3MoeForCausalLM

MODEL_CLASSES: dict[str, type[CausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
}


def supported_architectures() -> list[str]:
    return sorted(MODEL_CLASSES)


def model_class(config, where: object = "the model") -> type[CausalLM]:
    """The class for the first of the config's architectures the engine runs; otherwise an
    error naming them and every supported one."""
    archs = list(getattr(config, "architectures", None) or [])
    for arch in archs:
        if arch in MODEL_CLASSES:
            return MODEL_CLASSES[arch]
    raise UnsupportedArchitecture(f"model at {where} has architectures {sorted(archs)}; tokenmill runs "
                     f"{', '.join(supported_architectures())}")
