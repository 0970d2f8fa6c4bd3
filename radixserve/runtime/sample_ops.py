"""The sampler's device math over per-row parameters: no host reads, no data-dependent shapes.

Every function here takes tensors already gathered for the step's rows and
runs the same kernels eagerly and inside a CUDA graph (runtime/sampled_graphs.py),
so a graph replay and the eager sampler draw the same tokens. Parameters that
a row does not use are identities, exactly: top_k = vocab and top_p = 1 keep
every token, min_p = 0 masks nothing, repetition 1 and frequency/presence 0
leave the logits bit for bit. So one step may apply a path to all its rows
whenever any row needs it.
"""

from __future__ import annotations

import torch

from radixserve.runtime.noise import exponential_noise, step_words

# Columns of the sampler's per-row parameters ([rows, 8] float32).
TEMP, TOP_K, TOP_P, MIN_P, GREEDY, REP, FREQ, PRES = range(8)


def apply_penalties(
    logits: torch.Tensor, counts: torch.Tensor, seen: torch.Tensor, par: torch.Tensor
) -> None:
    """Penalize `logits` [n, vocab] float32 in place from each row's output `counts` [n, vocab]
    (int32), `seen` tokens [n, vocab] (prompt or output) and parameters `par` [n, 8]."""
    rep, freq, pres = (par[:, c : c + 1] for c in (REP, FREQ, PRES))
    c = counts.float()
    # Repetition penalty as in transformers: divide positive, multiply negative logits.
    pen = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
    logits.copy_(pen - freq * c - pres * (c > 0).float())


def top_k_top_p(probs: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """`probs` [n, vocab] masked to each row's top `k` [n, 1] int64 (clamped to the vocabulary)
    and its smallest prefix reaching `top_p` [n, 1]. A stable sort: tied probabilities keep id
    order, so which of them a boundary keeps does not depend on the sort's algorithm."""
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    ranks = torch.arange(probs.shape[-1], device=probs.device)[None, :]
    cum = sorted_p.cumsum(dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token always stays); a row
    # with top_p == 1 keeps all, even where the float sum overshoots 1.
    drop = (ranks >= k) | (((cum - sorted_p) >= top_p) & (top_p < 1.0))
    return torch.zeros_like(probs).scatter_(-1, order, sorted_p.masked_fill(drop, 0.0))


def min_p_mask(probs: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Tokens below `min_p` [n, 1] times their row's most likely token are dropped."""
    return probs.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, 0.0)


def draw(
    logits: torch.Tensor,
    par: torch.Tensor,
    keys: torch.Tensor,
    positions: torch.Tensor,
    columns: torch.Tensor,
    top_k_p: bool,
    min_p: bool,
) -> torch.Tensor:
    """Next ids [n] of `logits` [n, vocab] float32 (edits applied): greedy rows the argmax,
    the others one exponential race (argmax p / Exp(1), a draw from p) over the tempered,
    masked distribution, its noise keyed by the row's `keys` [n] and `positions` [n]
    (runtime/noise.py). `top_k_p` / `min_p`: whether to apply those masks at all."""
    probs = torch.softmax(logits / par[:, TEMP : TEMP + 1], dim=-1)
    if top_k_p:
        probs = top_k_top_p(probs, par[:, TOP_K : TOP_K + 1].long(), par[:, TOP_P : TOP_P + 1])
    if min_p:
        probs = min_p_mask(probs, par[:, MIN_P : MIN_P + 1])
    noise = exponential_noise(step_words(keys, positions), columns)
    sampled = (probs / noise).argmax(dim=-1)
    return torch.where(par[:, GREEDY] > 0, logits.argmax(dim=-1), sampled)
