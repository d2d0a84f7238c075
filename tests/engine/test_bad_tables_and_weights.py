"""Bad block tables and bad checkpoints are clear errors, never out-of-bounds reads or a partly random model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.attention.cpu_kernels import PagedDecodeKernel, load
from engine.model_loader import load_model

BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def kernel() -> PagedDecodeKernel:
    lib = load()
    assert lib is not None, "the C decode kernel did not build (a C compiler is part of the dev setup)"
    return PagedDecodeKernel(lib)


@pytest.mark.parametrize("bad", [-1, 6, 1 << 30])
def test_decode_kernel_refuses_block_ids_outside_the_pool(kernel, bad: int) -> None:
    num_blocks = 6
    k_cache = torch.randn(2, num_blocks, BLOCK_SIZE, 64)
    q = torch.randn(2, 2, 64)
    lens = [20, 40]  # sequence 1 reads three blocks; its third is bad
    tables = torch.tensor([[0, 1, 5], [2, 3, bad]], dtype=torch.int32)
    with pytest.raises(IndexError, match=f"block table of sequence 1 holds block id {bad} outside the KV pool of 6"):
        kernel(q, k_cache, k_cache.clone(), tables, torch.tensor(lens, dtype=torch.int32), lens, 0.125)
    # entries past a sequence's length are never read, so padding there is fine
    tables[1, 2] = 4
    tables[0, 2] = -1
    out = kernel(q, k_cache, k_cache.clone(), tables, torch.tensor(lens, dtype=torch.int32), lens, 0.125)
    assert torch.isfinite(out).all()


def _copy_with(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    (weights,) = dst.glob("*.safetensors")
    tensors = load_file(str(weights))
    edit(tensors)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return dst


def test_checkpoint_with_missing_unexpected_or_misshapen_tensors_names_them(tiny_model_dir, tmp_path) -> None:
    def break_it(t: dict[str, torch.Tensor]) -> None:
        del t["model.layers.1.self_attn.k_proj.weight"]
        del t["model.layers.0.mlp.down_proj.weight"]
        t["model.layers.7.self_attn.q_proj.weight"] = torch.zeros(64, 64)  # no layer 7 in a 2-layer model
        t["model.extra_head.weight"] = torch.zeros(4)
        t["model.norm.weight"] = torch.zeros(1)  # would broadcast into the 64-wide norm

    bad = _copy_with(tiny_model_dir, tmp_path / "bad", break_it)
    with pytest.raises(ValueError) as err:
        load_model(bad, torch.float32, "cpu", 128)
    message = str(err.value)
    assert message.startswith(f"checkpoint at {bad} does not match the model:")
    assert ("missing tensors (2): model.layers.0.mlp.down_proj.weight, model.layers.1.self_attn.k_proj.weight"
            in message)
    assert ("unexpected tensors (2): model.extra_head.weight (model.safetensors), "
            "model.layers.7.self_attn.q_proj.weight (model.safetensors)") in message
    assert "wrong shape tensors (1): model.norm.weight [1] (expected [64])" in message


def test_a_whole_checkpoint_still_loads(tiny_model_dir) -> None:
    model = load_model(tiny_model_dir, torch.float32, "cpu", 128)
    reference = load_file(str(next(tiny_model_dir.glob("*.safetensors"))))
    assert torch.equal(model.norm.weight, reference["model.norm.weight"])
    k_rows = model.layers[1].self_attn.kv_size
    q_rows = model.layers[1].self_attn.q_size
    qkv = model.layers[1].self_attn.qkv_proj.weight
    assert torch.equal(qkv[q_rows : q_rows + k_rows], reference["model.layers.1.self_attn.k_proj.weight"])
