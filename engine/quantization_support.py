"""Which quantized checkpoints the engine runs: the one place that decides (issue 44 widens it).

A checkpoint's ``config.json`` names its method in ``quantization_config.quant_method``; loading
one the engine does not run would fail as a list of missing and unexpected tensors, so it is
refused here first, in one line naming the method.
"""

from __future__ import annotations

from typing import Any

from engine.model_errors import UnsupportedQuantization

SUPPORTED_METHODS: frozenset[str] = frozenset()  # unquantized weights only, for now


def quantization_method(config: Any) -> str | None:
    """The config's ``quant_method`` (``"fp8"``, ``"awq"``, ``"gptq"``...), or None when unquantized."""
    qc = getattr(config, "quantization_config", None)
    if qc is None:
        return None
    method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    method = getattr(method, "value", method)  # transformers keeps some as an enum
    return str(method or "unknown")


def check_quantization(config: Any, where: object = "the model") -> None:
    """Raise ``UnsupportedQuantization`` unless the checkpoint's weights are a kind the engine runs."""
    method = quantization_method(config)
    if method is not None and method not in SUPPORTED_METHODS:
        raise UnsupportedQuantization(
            f"model at {where} is quantized with {method!r}, which tokenmill does not run; "
            "use an unquantized (float16/bfloat16/float32) checkpoint"
        )
