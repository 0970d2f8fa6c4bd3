"""The Triton extend (prefill) kernel: several new tokens per request, causal with its prefix.

The layout, the base-2 online softmax and the helpers are those of `triton_kernels`.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from radixserve.runtime.attention.triton_kernels import check_qkv, dot_precision
from radixserve.runtime.attention.triton_softmax import LOG2E, attend_tile, normalized


@triton.jit
def _extend_kernel(
    Q,
    K,
    V,
    qo_indptr,
    kv_indptr,
    kv_indices,
    Out,
    sm_scale_log2,
    stride_qt,
    stride_qh,
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One program: request b, query head h, BLOCK_M of its new tokens.

    New token i of a request with prefix p sits at position p + i and sees
    context positions 0..p+i; the key loop stops at the block's last row.
    """
    b = tl.program_id(0)
    h = tl.program_id(1)
    mb = tl.program_id(2)
    q_start = tl.load(qo_indptr + b)
    q_len = tl.load(qo_indptr + b + 1) - q_start
    if mb * BLOCK_M >= q_len:
        return
    kv_start = tl.load(kv_indptr + b)
    kv_len = tl.load(kv_indptr + b + 1) - kv_start
    prefix = kv_len - q_len
    hk = h // GROUP

    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < q_len
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    q = tl.load(
        Q + (q_start + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
        mask=m_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    q_pos = prefix + offs_m

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    end = tl.minimum(kv_len, prefix + (mb + 1) * BLOCK_M)
    for start in range(0, end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        slots = tl.load(kv_indices + kv_start + offs_n, mask=n_mask, other=0).to(tl.int64)
        visible = n_mask[None, :] & (offs_n[None, :] <= q_pos[:, None])  # causal
        m_i, l_i, acc = attend_tile(
            q,
            K + hk * stride_kh,
            V + hk * stride_vh,
            slots,
            n_mask,
            visible,
            stride_kn,
            stride_vn,
            offs_d,
            d_mask,
            sm_scale_log2,
            m_i,
            l_i,
            acc,
            DOT_PRECISION,
        )

    out, _ = normalized(acc, l_i, m_i)
    tl.store(
        Out + (q_start + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
        out.to(Out.dtype.element_ty),
        mask=m_mask[:, None] & d_mask[None, :],
    )


def extend_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float,
    max_extend_len: int,
    block_m: int = 64,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """Several new tokens per request, causal with each request's prefix.

    q `[T, Hq, D]` (rows by `qo_indptr`) -> `[T, Hq, D]`. `max_extend_len`
    (a host value) sizes the grid; programs past a request's end exit.
    """
    q = check_qkv(q, k_pool, v_pool)
    batch = qo_indptr.shape[0] - 1
    _, num_heads, head_dim = q.shape
    group = num_heads // k_pool.shape[1]
    out = torch.empty_like(q)
    grid = (batch, num_heads, max(1, math.ceil(max_extend_len / block_m)))
    _extend_kernel[grid](
        q,
        k_pool,
        v_pool,
        qo_indptr,
        kv_indptr,
        kv_indices,
        out,
        sm_scale * LOG2E,
        q.stride(0),
        q.stride(1),
        k_pool.stride(0),
        k_pool.stride(1),
        v_pool.stride(0),
        v_pool.stride(1),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        DOT_PRECISION=dot_precision(q.dtype),
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out
