"""Log-probabilities of sampled and prompt tokens, with the top-k alternatives, as vLLM reports them.

Values are the log-softmax of the model's raw float32 logits, taken before temperature and
top-k/top-p filtering (vLLM's default "raw" logprobs). For a structured-output request the
grammar mask is applied first, as in vLLM (forbidden tokens never appear, the allowed ones
are renormalised); prompt logprobs are never masked. Ranks are 1-based over the vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from engine.outputs import Logprob, PositionLogprobs


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1)


def position_logprobs(logprobs: torch.Tensor, token_ids: Sequence[int], top_k: Sequence[int]) -> list[PositionLogprobs]:
    """One dict per row of ``logprobs`` ``[rows, vocab]``: the row's token (``token_ids[i]``)
    first, then the ``top_k[i]`` most likely tokens (the token is not repeated if among them).
    Works where the logprobs are: on a GPU only the chosen values, ranks and top-k come back."""
    if logprobs.shape[0] == 0:
        return []
    tokens = torch.tensor(list(token_ids), dtype=torch.int64).to(logprobs.device, non_blocking=True)
    chosen = logprobs.gather(1, tokens[:, None]).squeeze(1)
    ranks = (logprobs > chosen[:, None]).sum(dim=1) + 1
    k_max = max(top_k)
    top_ids: list[list[int]] = [[] for _ in top_k]
    top_vals: list[list[float]] = [[] for _ in top_k]
    if k_max > 0:
        vals, ids = torch.topk(logprobs, k_max, dim=-1)
        top_ids, top_vals = ids.tolist(), vals.tolist()
    out: list[PositionLogprobs] = []
    for i, (tok, lp, rank, k) in enumerate(zip(tokens.tolist(), chosen.tolist(), ranks.tolist(), top_k, strict=True)):
        entry = {tok: Logprob(lp, rank)}
        for r in range(k):
            alt = top_ids[i][r]
            if alt not in entry and top_vals[i][r] > float("-inf"):  # masked tokens are not alternatives
                entry[alt] = Logprob(top_vals[i][r], r + 1)
        out.append(entry)
    return out


def decode_entries(entries: Sequence[PositionLogprobs | None], decode: Callable[[int], str]) -> None:
    """Fill ``decoded_token`` (the token's text on its own) in place."""
    for entry in entries:
        if entry is None:
            continue
        for tok, lp in entry.items():
            if lp.decoded_token is None:
                lp.decoded_token = decode(tok)


def prompt_logprobs_for_rows(
    logits: torch.Tensor, prompt_token_ids: Sequence[int], first: int, top_k: int
) -> list[PositionLogprobs]:
    """Rows are the logits at prompt positions ``first, first + 1, ...``; row j scores the
    prompt token at ``first + j + 1``."""
    n = logits.shape[0]
    targets = prompt_token_ids[first + 1 : first + 1 + n]
    return position_logprobs(log_softmax(logits), targets, [top_k] * n)
