"""Partial results of the split decode kernels and their merge: each (request, query head)'s
splits hold a normalised output and its log2-sum-exp, merged by their weights. Shared by the
plain split-K decode (`triton_kernels`) and the cascade's two levels (`triton_cascade`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _decode_reduce_kernel(
    Mid_O,
    Mid_LSE,
    Out,
    stride_ot,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """Merge the splits of (request b, query head h) by their log-sum-exp."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    s_mask = offs_s < NUM_SPLITS
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    row0 = (b * NUM_HEADS + h) * NUM_SPLITS
    lse = tl.load(Mid_LSE + row0 + offs_s, mask=s_mask, other=float("-inf"))
    # Split 0 always holds the first token, so the maximum is finite.
    w = tl.math.exp2(lse - tl.max(lse, 0))
    used = lse > float("-inf")  # empty splits wrote no output: never read it (0 * garbage)
    o = tl.load(
        Mid_O + (row0 + offs_s)[:, None] * BLOCK_D + offs_d[None, :],
        mask=(s_mask & used)[:, None] & d_mask[None, :],
        other=0.0,
    )
    out = tl.sum(o * w[:, None], 0) / tl.sum(w, 0)
    tl.store(Out + b * stride_ot + h * stride_oh + offs_d, out.to(Out.dtype.element_ty), mask=d_mask)


def new_partials(q: torch.Tensor, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Room for `num_splits` partial results per (request, query head): output and log2-sum-exp."""
    batch, num_heads, head_dim = q.shape
    block_d = triton.next_power_of_2(head_dim)
    mid_o = torch.empty((batch, num_heads, num_splits, block_d), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((batch, num_heads, num_splits), dtype=torch.float32, device=q.device)
    return mid_o, mid_lse


def reduce_partials(mid: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor) -> None:
    """Merge every (request, head)'s partials by their log-sum-exp into `out` `[B, Hq, D]`;
    partial 0 must be non-empty (it holds the request's first key)."""
    mid_o, mid_lse = mid
    batch, num_heads, splits = mid_lse.shape
    _decode_reduce_kernel[(batch, num_heads)](
        mid_o,
        mid_lse,
        out,
        out.stride(0),
        out.stride(1),
        NUM_HEADS=num_heads,
        HEAD_DIM=out.shape[2],
        BLOCK_D=mid_o.shape[3],
        NUM_SPLITS=splits,
        BLOCK_S=triton.next_power_of_2(splits),
        num_warps=4,
    )
