"""A GGUF model's quantized linears run as stored (issue 44): the model directory built from a
GGUF (``engine/model_registry.py``) keeps the file (``GGUF_FILE``, ``gguf/model.gguf``) beside the float weights
transformers dequantised; the loader fills the model from those, then each linear whose GGUF
tensor ``gguf_blocks.py`` decodes is swapped for the product that runs its blocks:

- 4-bit types (Q4_K, Q4_1, Q4_0) -> ``Int4Linear``: the C int4 kernel, group 32, float32 scale
  and offset, so the weight it builds is gguf's dequantisation bit for bit (``int4_kernel.py``) and
  a float32 model runs as stored too; without that kernel (no compiler, ``TOKENMILL_CPU_KERNELS=0``)
  torch's int4 kernel, which rounds rows and scales to bfloat16: then only 16-bit models do;
- int8 types (Q8_0, Q5_0) -> ``GroupInt8Linear``: int8 values, float16 scale per 32, weight-only
  (its weight is gguf's dequantisation bit for bit: exact at every dtype).

Names map through gguf's own ``TensorNameMap``; llama.cpp's q/k row permutation (``llama`` only,
as transformers undoes it) is undone on the quantized rows. Before a swap the decoded weight must
equal, bit for bit, the float weight transformers loaded for that tensor: a name or row order
wrong here leaves the linear float rather than running a different model. The tied embedding /
LM head, and tensors in other types, stay float.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from engine.quant.checkpoint import QuantWeight
from engine.quant.gguf_blocks import BITS, decode, permute_rows
from engine.quant.group_int8 import GroupInt8Linear
from engine.quant.linear import Int4Linear

AS_STORED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # float32: 4-bit needs the C kernel


@dataclass
class GGUFLinear:
    weight: QuantWeight
    type_name: str  # Q4_K, Q8_0, ...
    bits: int  # 4 or 8: the product it can run on


def _arch_map(reader, num_layers: int):
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    name = str(reader.fields["general.architecture"].contents())
    arch = next((a for a, n in MODEL_ARCH_NAMES.items() if n == name), None)
    return name, None if arch is None else get_tensor_name_map(arch, num_layers)


def _llama_order(rows: int, heads: int) -> torch.Tensor:
    """Row order undoing llama.cpp's q/k permutation (transformers' ``_reverse_permute_weights``)."""
    return torch.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1)


def gguf_linears(path: Path, config, layout: dict, params: dict) -> tuple[dict, Counter]:
    """``({(parameter, first row): GGUFLinear}, Counter of what stays float and why)`` for the
    model's linears whose GGUF tensor is kept as stored and equals the loaded float weight."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    arch, name_map = _arch_map(reader, config.num_hidden_layers)
    tensors = {t.name: t for t in reader.tensors}
    found: dict = {}
    left: Counter = Counter()
    for hf_name, (pname, index) in layout.items():
        if not hf_name.endswith(".weight") or name_map is None or params[pname].dim() != 2:
            continue
        base = name_map.get_name(hf_name.removesuffix(".weight"))
        tensor = tensors.get(f"{base}.weight") if base else None
        if tensor is None or base == "token_embd":
            continue
        if tensor.tensor_type not in BITS:
            left[tensor.tensor_type.name] += 1
            continue
        qw = decode(tensor.data, tensor.tensor_type, (int(tensor.shape[1]), int(tensor.shape[0])))
        if arch == "llama" and base.endswith((".attn_q", ".attn_k")):
            heads = config.num_attention_heads if base.endswith("q") else config.num_key_value_heads
            qw = permute_rows(qw, _llama_order(qw.values.shape[0], heads))
        target = params[pname].data[index] if index else params[pname].data
        if qw.values.shape != target.shape or not torch.equal(qw.dequantize(), target.float()):
            left[f"{tensor.tensor_type.name} (differs from the loaded weight)"] += 1
            continue
        first = (index[0].start or 0) if index else 0
        found[(pname, first)] = GGUFLinear(qw, tensor.tensor_type.name, BITS[tensor.tensor_type])
    return found, left


def swap_gguf_linears(model: nn.Module, found: dict, left: Counter) -> str:
    """Swap each linear all of whose row blocks were found; returns what runs, for ``llm.engine.quantization``."""
    by_param: dict[str, list[tuple[int, GGUFLinear]]] = {}
    for (pname, first), lin in found.items():
        by_param.setdefault(pname, []).append((first, lin))
    runs: Counter = Counter()
    for pname, parts in by_param.items():
        mname = pname.rpartition(".")[0]
        module = model.get_submodule(mname)
        parts.sort(key=lambda p: p[0])
        names = "+".join(sorted({lin.type_name for _, lin in parts}))
        if sum(lin.weight.values.shape[0] for _, lin in parts) != module.weight.shape[0]:
            left[f"{names} (a fused linear partly in other types)"] += 1
            continue
        cls = Int4Linear if all(lin.bits == 4 for _, lin in parts) else GroupInt8Linear
        try:
            quantized = cls(QuantWeight.cat([lin.weight for _, lin in parts]), module.bias)
        except ValueError:  # mixed zero points / offsets, or a shape the product does not take
            left[f"{names} (no product for this mix or shape)"] += 1
            continue
        if module.weight.dtype == torch.float32 and getattr(quantized, "rounds_to_bfloat16", False):
            left[f"{names} (float32 needs the C int4 kernel)"] += 1  # torch's would round the rows
            continue
        parent, _, child = mname.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, quantized)
        runs[f"{names} as {'int4' if cls is Int4Linear else 'int8 weight-only'}"] += 1
    stored = ", ".join(f"{k} x{v}" for k, v in sorted(runs.items()))
    floats = ", ".join(f"{k} x{v}" for k, v in sorted(left.items()))
    return f"GGUF as stored: {stored or 'nothing'}" + (f"; dequantised: {floats}" if floats else "")
