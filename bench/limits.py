"""The physical limit of a workload on this machine, from same-run ceilings.

Any engine must (a) do the workload's arithmetic: every distinct prompt token and every output
token through the layers, the LM head only for sampled tokens, attention over each token's
context; at best at the plain matmul rate measured in the same run; and (b) run at least as
many sequential steps as the longest output, each streaming every weight from memory once.
The lower bound on time is the larger of the two (see shared/reference/cpu-speed-notes.md).
"""

from __future__ import annotations


def workload_flops(wl, body_params: int, embed_params: int, attn_flops_per_ctx: int) -> float:
    distinct_prompt = wl.prompt_tokens - max(0, len(wl.prompts) - 1) * wl.shared_prefix
    linear = 2.0 * body_params * (distinct_prompt + wl.output_tokens) + 2.0 * embed_params * wl.output_tokens
    attention = sum(attn_flops_per_ctx * (len(p) + m) ** 2 / 2 for p, m in zip(wl.prompts, wl.max_tokens, strict=True))
    return linear + attention


def limit(wl, model, matmul_gflops: float, bandwidth_gbs: float, weight_bytes: int) -> dict:
    cfg = model.config
    embed = model.embed_tokens.weight.numel()
    body = sum(p.numel() for p in model.parameters()) - embed
    attn = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * model.head_dim
    flops = workload_flops(wl, body, embed, attn)
    compute_s = flops / (matmul_gflops * 1e9)
    stream_s = max(wl.max_tokens) * weight_bytes / (bandwidth_gbs * 1e9)
    seconds = max(compute_s, stream_s)
    return {"flops": flops, "compute_bound_s": compute_s, "streaming_bound_s": stream_s,
            "limit_output_tok_s": wl.output_tokens / seconds}
