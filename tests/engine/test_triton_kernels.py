"""The Triton kernels against the torch backend, run on CPU under the Triton interpreter.

Each backend gets the same logical pool contents in its own layout (``kv_cache_shape``), and
pools are compared after ``write_kv`` in one canonical layout. The interpreter runs one
program instance at a time in numpy, so head counts and batches stay small; lengths still
cross block boundaries (1, 15, 16, 17, 100) and cached contexts end mid-block.
"""

from __future__ import annotations

import os

# Must precede the first ``import triton`` in the process: triton 3.9 reads it when @triton.jit
# decorates a function, including triton.language's own helpers at import time. Importing
# transformers (and so ``engine``) imports triton through torch, so in a whole-suite run
# tests/conftest.py has to set it; this line covers running the file alone.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from engine.attention.backend import AttentionBackend  # noqa: E402
from engine.attention.metadata import AttentionMetadata  # noqa: E402
from engine.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from engine.attention.triton_backend import DecodeLaunch, ExtendLaunch, TritonAttentionBackend, interpreted  # noqa: E402
from engine.attention.triton_kernels import extend_kernel  # noqa: E402

INTERPRETED = interpreted(extend_kernel)


@pytest.fixture(autouse=True)
def _needs_interpreter() -> None:
    """Fail with the fix, not an interpreter traceback, when triton came in before the env var."""
    if not INTERPRETED:
        pytest.fail("triton was imported before TRITON_INTERPRET=1 was set: set it in tests/conftest.py "
                    "(before any import) or in the environment", pytrace=False)


BLOCK_SIZE = 16
TOL = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
}


def make_meta(
    seqs: list[tuple[int, int]], num_decodes: int, num_blocks: int, gen: torch.Generator,
) -> AttentionMetadata:
    """Metadata for ``(context_len, query_len)`` per sequence, decodes first.

    Each sequence gets distinct, randomly drawn block ids (shuffled, non-contiguous), and the
    table is padded with 0 like the engine's.
    """
    seq_lens = [c + q for c, q in seqs]
    need = [-(-s // BLOCK_SIZE) for s in seq_lens]
    assert sum(need) <= num_blocks
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(len(seqs), max(need), dtype=torch.int32)
    slots: list[int] = []
    for i, ((ctx, q), n) in enumerate(zip(seqs, need, strict=True)):
        row = [ids.pop() for _ in range(n)]
        tables[i, :n] = torch.tensor(row, dtype=torch.int32)
        slots += [row[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(ctx, ctx + q)]
    qlens = [q for _, q in seqs]
    starts = [0]
    for q in qlens:
        starts.append(starts[-1] + q)
    return AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        context_lens=torch.tensor([c for c, _ in seqs], dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        block_tables=tables,
        block_size=BLOCK_SIZE,
        num_decodes=num_decodes,
        max_query_len=max(qlens),
        max_seq_len=max(seq_lens),
        query_lens_host=qlens,
        seq_lens_host=seq_lens,
        context_lens_host=[c for c, _ in seqs],
    )


# Each backend layout as a permutation of the canonical [blocks, block_size, kv_heads, head_dim].
LAYOUT_PERMUTATIONS = {
    "blocks, block_size, heads, dim": (0, 1, 2, 3),  # triton
    "blocks, heads, block_size, dim": (0, 2, 1, 3),
    "heads, blocks, block_size, dim": (2, 0, 1, 3),  # torch
}


def layout_permutation(backend: AttentionBackend) -> tuple[int, ...]:
    """Found by asking the backend for a shape whose four sizes all differ, so none is ambiguous."""
    canonical = (5, BLOCK_SIZE, 3, 64)
    shape = tuple(backend.kv_cache_shape(*canonical))
    for perm in LAYOUT_PERMUTATIONS.values():
        if tuple(canonical[i] for i in perm) == shape:
            return perm
    raise NotImplementedError(f"test helper does not know layout {shape}")


def to_layout(canonical: torch.Tensor, backend: AttentionBackend) -> torch.Tensor:
    """A copy of a ``[blocks, block_size, kv_heads, head_dim]`` pool in ``backend``'s layout."""
    return canonical.permute(layout_permutation(backend)).clone(memory_format=torch.contiguous_format)


def from_layout(pool: torch.Tensor, backend: AttentionBackend) -> torch.Tensor:
    """The inverse of ``to_layout`` (a view in the canonical layout)."""
    perm = layout_permutation(backend)
    return pool.permute([perm.index(i) for i in range(4)])


def random_pool(num_blocks: int, num_kv_heads: int, head_dim: int, dtype, gen) -> torch.Tensor:
    """Random everywhere: the cached contexts, and garbage in unused slots that must not leak."""
    return torch.randn(num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, generator=gen).to(dtype)


def run_step(backend: AttentionBackend, q, k, v, k_cache, v_cache, meta, scale):
    """What the Attention layer does: write this step's KV, then attend."""
    backend.write_kv(k, v, k_cache, v_cache, meta)
    return backend.attend(q, k, v, k_cache, v_cache, meta, scale)


def step_inputs(seqs: list[tuple[int, int]], num_decodes: int, dtype: torch.dtype, num_kv_heads: int, group: int,
                head_dim: int, seed: int, spare_blocks: int):
    """One step's metadata, random K/V pools and this step's q/k/v, all drawn from ``seed``:
    ``(meta, k_pool, v_pool, q, k, v)``."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-(c + q) // BLOCK_SIZE) for c, q in seqs) + spare_blocks
    meta = make_meta(seqs, num_decodes, num_blocks, gen)
    k_pool = random_pool(num_blocks, num_kv_heads, head_dim, dtype, gen)
    v_pool = random_pool(num_blocks, num_kv_heads, head_dim, dtype, gen)
    T = meta.num_tokens
    q = torch.randn(T, num_kv_heads * group, head_dim, generator=gen).to(dtype)
    k = torch.randn(T, num_kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(T, num_kv_heads, head_dim, generator=gen).to(dtype)
    return meta, k_pool, v_pool, q, k, v


def check_step(
    seqs: list[tuple[int, int]], num_decodes: int, dtype: torch.dtype, num_kv_heads: int, group: int,
    head_dim: int, triton_backend: TritonAttentionBackend | None = None, seed: int = 0,
) -> None:
    """Write + attend one step with both backends from the same pool; outputs and pools agree."""
    meta, k_pool, v_pool, q, k, v = step_inputs(seqs, num_decodes, dtype, num_kv_heads, group, head_dim, seed, 3)
    scale = head_dim**-0.5

    results = []
    for backend in (TorchAttentionBackend(), triton_backend or TritonAttentionBackend()):
        kc, vc = to_layout(k_pool, backend), to_layout(v_pool, backend)
        out = run_step(backend, q, k, v, kc, vc, meta, scale)
        results.append((out, from_layout(kc, backend), from_layout(vc, backend)))
    (expected, k_ref, v_ref), (got, k_got, v_got) = results

    assert torch.equal(k_got, k_ref) and torch.equal(v_got, v_ref)
    assert got.dtype == dtype and got.shape == q.shape
    torch.testing.assert_close(got.float(), expected.float(), **TOL[dtype])


LENGTHS = [1, 15, 16, 17, 100]
# (num_kv_heads, group, head_dim): GQA ratio 1 and 3, head_dim 64 and 128.
SHAPES = [(2, 1, 64), (1, 3, 128), (1, 1, 128), (2, 3, 64)]
DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_kv_heads,head_dim", [(2, 64), (3, 128)])
def test_write_kv_skips_negative_slots(dtype, num_kv_heads, head_dim) -> None:
    gen = torch.Generator().manual_seed(1)
    num_blocks, T = 4, 9
    backend = TritonAttentionBackend()
    k_cache = torch.randn(backend.kv_cache_shape(num_blocks, BLOCK_SIZE, num_kv_heads, head_dim), generator=gen)
    v_cache = torch.randn_like(k_cache)
    k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    slots = torch.randperm(num_blocks * BLOCK_SIZE, generator=gen)[:T]
    slots[[2, 5, 8]] = -1
    # A strided view, as the model's fused qkv projection hands it over.
    kv = torch.randn(T, 2 * num_kv_heads, head_dim, generator=gen).to(dtype)
    key, value = kv[:, :num_kv_heads], kv[:, num_kv_heads:]
    meta = make_meta([(0, T)], 0, num_blocks, gen)
    meta.slot_mapping = slots

    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected_k[slot // BLOCK_SIZE, slot % BLOCK_SIZE] = key[t]
            expected_v[slot // BLOCK_SIZE, slot % BLOCK_SIZE] = value[t]
    backend.write_kv(key, value, k_cache, v_cache, meta)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_kv_heads,group,head_dim", SHAPES)
def test_decode_matches_torch(dtype, num_kv_heads, group, head_dim) -> None:
    seqs = [(n - 1, 1) for n in LENGTHS]
    check_step(seqs, len(seqs), dtype, num_kv_heads, group, head_dim)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_split_k_matches_torch(dtype) -> None:
    """Three splits of interleaved 64-token tiles: 100- and 150-token contexts span 2-3 splits,
    short ones leave splits empty."""
    backend = TritonAttentionBackend(DecodeLaunch(block_n=64, min_partition=64, target_programs=1 << 16))
    seqs = [(n - 1, 1) for n in [150, 1, 17, 64, 65, 100]]
    assert backend._num_splits(len(seqs), 1, 150) == 3
    check_step(seqs, len(seqs), dtype, 1, 3, 64, triton_backend=backend)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_kv_heads,group,head_dim", SHAPES)
def test_extend_matches_torch(dtype, num_kv_heads, group, head_dim) -> None:
    """Fresh prefills of every length, plus chunks whose cached prefix ends mid-block."""
    seqs = [(0, n) for n in LENGTHS] + [(5, 11), (21, 40), (33, 1), (16, 17)]
    check_step(seqs, 0, dtype, num_kv_heads, group, head_dim)


def test_extend_launches_match_torch() -> None:
    """Other tiles than the default's: 32-row query tiles over 16-position key tiles, chunks
    crossing tile and block edges."""
    backend = TritonAttentionBackend(extend=ExtendLaunch(block_m=32, block_n=16, num_warps=4, num_stages=3))
    seqs = [(0, 1), (0, 9), (0, 33), (5, 11), (21, 40), (16, 17)]
    check_step(seqs, 0, torch.bfloat16, 2, 4, 64, triton_backend=backend, seed=2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_kv_heads,group,head_dim", [(1, 1, 128), (3, 3, 64)])
def test_mixed_decodes_and_extends_match_torch(dtype, num_kv_heads, group, head_dim) -> None:
    seqs = [(14, 1), (0, 1), (99, 1), (15, 1), (0, 17), (31, 9), (7, 70)]
    check_step(seqs, 4, dtype, num_kv_heads, group, head_dim, seed=3)


def test_float16_mixed_matches_torch() -> None:
    check_step([(20, 1), (3, 30)], 1, torch.float16, 1, 2, 64, seed=5)


def test_padded_decode_rows_are_inert() -> None:
    """CUDA-graph padding: a decode row with seq_len 0 and slot -1 writes nothing to the pool and
    gets zeros (not NaN), and the real row matches the reference."""
    gen = torch.Generator().manual_seed(9)
    meta = make_meta([(20, 1), (0, 1)], 2, 6, gen)
    meta.seq_lens[1] = 0
    meta.seq_lens_host[1] = 0
    meta.slot_mapping[1] = -1
    k_pool, v_pool = (random_pool(6, 1, 64, torch.float32, gen) for _ in range(2))
    q, k, v = (torch.randn(2, n, 64, generator=gen) for n in (2, 1, 1))
    backend = TritonAttentionBackend()
    kc, vc = to_layout(k_pool, backend), to_layout(v_pool, backend)
    got = run_step(backend, q, k, v, kc, vc, meta, 0.125)
    changed = [(from_layout(c, backend) != p).sum() for c, p in ((kc, k_pool), (vc, v_pool))]
    assert changed == [64, 64]  # only row 0's slot
    assert torch.equal(got[1], torch.zeros_like(got[1]))

    ref, ref_meta = TorchAttentionBackend(), make_meta([(20, 1)], 1, 6, torch.Generator().manual_seed(9))
    kc, vc = (to_layout(from_layout(c, backend), ref) for c in (kc, vc))
    expected = ref.attend(q[:1], k[:1], v[:1], kc, vc, ref_meta, 0.125)
    torch.testing.assert_close(got[:1], expected, **TOL[torch.float32])


def test_triton_backend_matches_torch_whole_model(tmp_path) -> None:
    """Greedy generation through the whole engine: chunked prefill (24-token budget), a shared
    prefix that hits the prefix cache mid-prompt, and mixed decode + prefill steps."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine import LLM, SamplingParams

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, initializer_range=0.2,
    )
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    gen = torch.Generator().manual_seed(7)
    shared = torch.randint(3, 256, (37,), generator=gen).tolist()
    prompts = [torch.randint(3, 256, (n,), generator=gen).tolist() for n in (1, 5, 17, 40)]
    prompts += [shared + [11, 12], shared + [13]]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)

    outputs = {}
    for backend in ("torch", "triton"):
        llm = LLM(model=str(tmp_path), attention_backend=backend, device="cpu", num_kv_blocks=64,
                  max_num_batched_tokens=24)
        outputs[backend] = [o.token_ids for o in llm.generate(prompts, params)]
    assert all(len(ids) == 6 for ids in outputs["torch"])
    assert outputs["triton"] == outputs["torch"]


@pytest.mark.parametrize("token_budget", [2048, 2])
def test_padded_decode_graph_buffers_match_the_eager_step(tiny_model_dir, token_budget):
    """The CUDA-graph decode path (static buffers, padded batch, slot -1, length 0) run
    eagerly under the interpreter gives the same tokens as the plain step. A budget of 2
    tokens makes steps of one decode plus a one-token prefill chunk that does not sample."""
    from engine import LLMEngine, SamplingParams
    from engine.config import EngineConfig
    from engine.cuda_graphs import DecodeGraphs

    def run(with_graph_buffers: bool) -> list[list[int]]:
        engine = LLMEngine(EngineConfig(model=str(tiny_model_dir), attention_backend="triton", device="cpu",
                                        num_kv_blocks=64, max_model_len=128, max_num_seqs=3,
                                        max_num_batched_tokens=token_budget))
        if with_graph_buffers:
            engine.runner.decode_graphs = DecodeGraphs(
                engine.runner.model, 16, engine.max_model_len, 3, "cpu", capture=False, batch_sizes=(2, 3)
            )
        for i, p in enumerate([[5, 6, 7], [9] * 20, [11, 12]]):
            engine.add_request(str(i), p, SamplingParams(max_tokens=4 + 3 * i, temperature=0, ignore_eos=True))
        outs = {}
        while engine.has_unfinished():
            outs.update({o.request_id: o.token_ids for o in engine.step()})
        if with_graph_buffers:
            graphs = engine.runner.decode_graphs
            assert graphs.steps >= 8 and graphs.padded_steps >= 3
        return [outs[str(i)] for i in range(3)]

    assert run(True) == run(False)
