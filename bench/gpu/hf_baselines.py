"""The HF transformers baselines of ``gpu_throughput.py``: continuous batching, and
``generate`` on static left-padded batches, on the same prompts and output budgets."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from common import free


def hf_continuous(model_dir: Path, prompts, budgets) -> dict:
    """transformers' continuous batching: one manager, each request with its own budget."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    gc_ = GenerationConfig(max_new_tokens=max(budgets), do_sample=False, eos_token_id=-1, pad_token_id=0)
    torch.cuda.reset_peak_memory_stats()
    results = {}
    t0 = time.perf_counter()
    with model.continuous_batching_context_manager(generation_config=gc_) as manager:
        startup = time.perf_counter() - t0
        t1 = time.perf_counter()
        for i, (p, b) in enumerate(zip(prompts, budgets, strict=True)):
            manager.add_request(input_ids=p, request_id=f"r{i}", max_new_tokens=b)
        while len(results) < len(prompts):
            if time.perf_counter() - t1 > 300:
                raise TimeoutError(f"HF continuous batching: {len(results)}/{len(prompts)} done after 300 s")
            r = manager.get_result(timeout=5)
            if r is None:
                if not manager.is_running():
                    raise RuntimeError("HF continuous batching thread stopped")
                continue
            done = r.is_finished() if hasattr(r, "is_finished") else "FINISHED" in str(r.status)
            if done:
                results[r.request_id] = r
        torch.cuda.synchronize()
        wall = time.perf_counter() - t1
        free_b, total_b = torch.cuda.mem_get_info()
    out_tokens = sum(len(r.generated_tokens) for r in results.values())
    res = {"requests": len(prompts), "wall_s": wall, "startup_s": startup, "output_tokens": out_tokens,
           "expected_output_tokens": sum(budgets), "output_tok_per_s": out_tokens / wall,
           "attn_implementation": getattr(model.config, "_attn_implementation", None),
           "gpu_used_gib": (total_b - free_b) / 2**30, "torch_peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30}
    print(f"  HF continuous {len(prompts)} req: {out_tokens} tok in {wall:.2f}s = {out_tokens / wall:.0f} tok/s", flush=True)
    del model
    free()
    return res


def hf_static(model_dir: Path, prompts, budgets, batch: int) -> dict:
    """HF ``generate`` on left-padded batches in input order, each to its longest budget;
    useful output = each request's own budget (what the other engines produce)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    model.generation_config.eos_token_id = None
    torch.cuda.reset_peak_memory_stats()
    generated = 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        for s in range(0, len(prompts), batch):
            ps, bs = prompts[s : s + batch], budgets[s : s + batch]
            width = max(map(len, ps))
            ids = torch.zeros(len(ps), width, dtype=torch.long)
            mask = torch.zeros(len(ps), width, dtype=torch.long)
            for i, p in enumerate(ps):
                ids[i, width - len(p):] = torch.tensor(p)
                mask[i, width - len(p):] = 1
            out = model.generate(ids.cuda(), attention_mask=mask.cuda(), max_new_tokens=max(bs), min_new_tokens=max(bs),
                                 do_sample=False, pad_token_id=0)
            generated += (out.shape[1] - width) * len(ps)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    free_b, total_b = torch.cuda.mem_get_info()
    res = {"requests": len(prompts), "batch": batch, "wall_s": wall, "useful_output_tokens": sum(budgets),
           "generated_tokens": generated, "output_tok_per_s": sum(budgets) / wall,
           "generated_tok_per_s": generated / wall, "gpu_used_gib": (total_b - free_b) / 2**30,
           "torch_peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30}
    print(f"  HF static {len(prompts)} req (batch {batch}): useful {sum(budgets)} tok in {wall:.2f}s = "
          f"{sum(budgets) / wall:.0f} tok/s", flush=True)
    del model
    free()
    return res
