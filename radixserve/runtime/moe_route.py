"""A mixture-of-experts router's softmax, top-k and renormalisation in one kernel.

transformers' routers (Mixtral, Qwen2-MoE, Qwen3-MoE) take the softmax of the
router logits in float32, keep the `k` largest probabilities (renormalised to sum
to one where the config says so) and cast the weights to the logits' dtype. In
torch that is five kernels per MoE layer of a decode step; here one program per
`BLOCK_T` tokens holds each token's row of logits and picks the `k` largest by
repeated arg-max (the lowest index among equals first, as torch.topk on CUDA
returns them in practice; a tie of float32 probabilities changes no weight).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK_T = 16


@triton.jit
def _route_kernel(
    Logits,
    TopIdx,
    TopW,
    tokens,
    num_experts,
    stride_t,
    TOP_K: tl.constexpr,
    K_P: tl.constexpr,
    E_P: tl.constexpr,
    BLOCK_T: tl.constexpr,
    RENORMALIZE: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    e = tl.arange(0, E_P)
    rows = t < tokens
    logits = tl.load(
        Logits + t[:, None] * stride_t + e[None, :],
        mask=rows[:, None] & (e[None, :] < num_experts),
        other=float("-inf"),
    ).to(tl.float32)
    logits = tl.where(rows[:, None], logits, 0.0)  # rows past the end: finite, never stored
    z = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    probs = z / tl.sum(z, axis=1)[:, None]
    slot = tl.arange(0, K_P)
    top_w = tl.zeros([BLOCK_T, K_P], dtype=tl.float32)
    top_i = tl.zeros([BLOCK_T, K_P], dtype=tl.int64)
    for j in range(TOP_K):
        best = tl.argmax(probs, axis=1, tie_break_left=True)
        value = tl.max(probs, axis=1)
        top_w = tl.where(slot[None, :] == j, value[:, None], top_w)
        top_i = tl.where(slot[None, :] == j, best[:, None].to(tl.int64), top_i)
        probs = tl.where(e[None, :] == best[:, None], -1.0, probs)  # taken: below every probability
    if RENORMALIZE:
        top_w = top_w / tl.sum(top_w, axis=1)[:, None]
    out = t[:, None] * TOP_K + slot[None, :]
    keep = rows[:, None] & (slot[None, :] < TOP_K)
    tl.store(TopIdx + out, top_i, mask=keep)
    tl.store(TopW + out, top_w.to(TopW.dtype.element_ty), mask=keep)


def route_topk(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(top-k expert ids `[T, k]` int64, their weights `[T, k]` in the logits' dtype) per token."""
    tokens, num_experts = logits.shape
    if logits.stride(-1) != 1:
        raise ValueError("route_topk reads rows: the logits must be contiguous in their last dim")
    top_idx = torch.empty(tokens, top_k, dtype=torch.int64, device=logits.device)
    top_w = torch.empty(tokens, top_k, dtype=logits.dtype, device=logits.device)
    if tokens == 0:
        return top_idx, top_w
    _route_kernel[(triton.cdiv(tokens, _BLOCK_T),)](
        logits,
        top_idx,
        top_w,
        tokens,
        num_experts,
        logits.stride(0),
        TOP_K=top_k,
        K_P=triton.next_power_of_2(top_k),
        E_P=triton.next_power_of_2(num_experts),
        BLOCK_T=_BLOCK_T,
        RENORMALIZE=renormalize,
        num_warps=4,
    )
    return top_idx, top_w
