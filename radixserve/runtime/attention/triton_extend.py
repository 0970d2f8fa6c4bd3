"""The Triton extend (prefill) kernel: several new tokens per request, causal with its prefix.

The layout, the base-2 online softmax and the helpers are those of `triton_kernels`.

Two grids. Eager steps size it from the host: (requests, heads, blocks of the
longest request). Steps captured in a CUDA graph (runtime/extend_graphs.py)
cannot follow the batch's shape, so they pass a tile table instead: one
(request, block) pair per program, padded with request -1 (the program
exits), which the host fills before each replay (`extend_tiles`). Its grid
puts a tile's query heads next to each other, so the heads of one K/V head
read its tiles while they are in L2.

A layer's window and soft-cap are the kernel's HAS_WINDOW / HAS_SOFTCAP switches
(`triton_softmax.layer_args`): with a window, a block's key loop starts at the
first key its first row sees, so whole tiles before the window are never read,
and the mask trims the boundary tile row by row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import triton
import triton.language as tl

from radixserve.runtime.attention.base import PLAIN_LAYER, LayerOptions
from radixserve.runtime.attention.triton_kernels import check_qkv, dot_precision
from radixserve.runtime.attention.triton_softmax import (
    LOG2E,
    attend_tile,
    fp8_logit_scale,
    fp8_output,
    kv_args,
    layer_args,
    normalized,
)
from radixserve.runtime.forward_batch import ForwardBatch


@triton.jit
def _extend_kernel(
    Q,
    K,
    V,
    qo_indptr,
    kv_indptr,
    kv_indices,
    Out,
    tiles,
    sm_scale_log2,
    stride_qt,
    stride_qh,
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    stride_ot,
    stride_oh,
    window,
    cap_log2,
    k_scale,
    v_scale,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    TILED: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    """One program: request b, query head h, BLOCK_M of its new tokens.

    New token i of a request with prefix p sits at position p + i and sees
    context positions 0..p+i (with a window w, only those past p+i-w); the key
    loop stops at the block's last row and, windowed, starts at its first row's window.
    KV_FP8: an FP8 pool (`attend_tile`).
    """
    sm_scale_log2 = fp8_logit_scale(sm_scale_log2, k_scale, KV_FP8)
    if TILED:  # grid (heads, tiles): (request, block) from the tile table
        h = tl.program_id(0)
        b = tl.load(tiles + 2 * tl.program_id(1))
        mb = tl.load(tiles + 2 * tl.program_id(1) + 1)
        if b < 0:
            return
    else:  # grid (requests, heads, blocks)
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
    begin = 0
    if HAS_WINDOW:  # the oldest key the block's first row sees; later rows see none older
        begin = tl.maximum(prefix + mb * BLOCK_M - window + 1, 0)
    for start in range(begin, end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        slots = tl.load(kv_indices + kv_start + offs_n, mask=n_mask, other=0).to(tl.int64)
        visible = n_mask[None, :] & (offs_n[None, :] <= q_pos[:, None])  # causal
        if HAS_WINDOW:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
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
            cap_log2,
            m_i,
            l_i,
            acc,
            DOT_PRECISION,
            HAS_SOFTCAP,
            KV_FP8,
        )

    out, _ = normalized(acc, l_i, m_i)
    out = fp8_output(out, v_scale, KV_FP8)
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
    tiles: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    opts: LayerOptions = PLAIN_LAYER,
) -> torch.Tensor:
    """Several new tokens per request, causal with each request's prefix, with the layer's
    window and soft-cap `opts`.

    q `[T, Hq, D]` (rows by `qo_indptr`) -> `[T, Hq, D]`. `max_extend_len`
    (a host value) sizes the grid; programs past a request's end exit.
    `tiles` (`[n, 2]` int32 on the device, from `extend_tiles` with the same
    `block_m`) replaces that grid by one program per tile and head; rows of
    `q` that no tile covers are left unwritten (in `out`, when given).
    """
    q = check_qkv(q, k_pool, v_pool)
    batch = qo_indptr.shape[0] - 1
    _, num_heads, head_dim = q.shape
    group = num_heads // k_pool.shape[1]
    out = torch.empty_like(q) if out is None else out
    if tiles is not None:
        grid: tuple[int, ...] = (num_heads, tiles.shape[0])
    else:
        grid = (batch, num_heads, max(1, math.ceil(max_extend_len / block_m)))
    _extend_kernel[grid](
        q,
        k_pool,
        v_pool,
        qo_indptr,
        kv_indptr,
        kv_indices,
        out,
        qo_indptr if tiles is None else tiles,  # (unread when not tiled)
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
        TILED=tiles is not None,
        num_warps=num_warps,
        num_stages=num_stages,
        **layer_args(opts),
        **kv_args(opts),
    )
    return out


def extend_tiles(extend_lens: Sequence[int], block_m: int, capacity: int, first: int = 0) -> np.ndarray:
    """The tile table of a step: `[capacity, 2]` int32, (request, block) per tile of
    `block_m` new tokens, request after request from request `first`, then (-1, 0) rows."""
    lens = np.asarray(extend_lens, dtype=np.int64)
    lens[:first] = 0
    blocks = -(-lens // block_m)
    n = int(blocks.sum())
    if n > capacity:
        raise ValueError(f"{n} tiles of {block_m} tokens do not fit a table of {capacity}")
    out = np.full((capacity, 2), -1, dtype=np.int32)
    out[n:, 1] = 0
    req = np.repeat(np.arange(len(lens), dtype=np.int32), blocks)
    out[:n, 0] = req
    out[:n, 1] = np.arange(n, dtype=np.int32) - np.repeat(np.cumsum(blocks) - blocks, blocks)
    return out


GRAPH_BLOCK_M = 64


def graph_attention(
    q: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    batch: ForwardBatch,
    sm_scale: float,
    opts: LayerOptions = PLAIN_LAYER,
) -> torch.Tensor:
    """The attention of a graph-replayed extend step (`batch.graph` set): the decode kernel
    over the leading rows, then the extend kernel's tiles over the rest, into one output
    (both with the layer's `opts`, baked into the graph: a layer's are always the same)."""
    from radixserve.runtime.attention import triton_kernels as tk

    g = batch.graph
    assert g is not None
    out = torch.empty_like(q)
    d = g.decode_indptr.shape[0] - 1
    if d:  # rows past the decode rows have no keys here; their tiles overwrite them below
        tk.decode_attention(
            q[:d], kv, (g.decode_indptr, batch.kv_indices), sm_scale, g.decode_tiling, out[:d], opts
        )
    return extend_attention(
        q,
        kv[0],
        kv[1],
        batch.qo_indptr,
        batch.kv_indptr,
        batch.kv_indices,
        sm_scale,
        max_extend_len=0,
        block_m=GRAPH_BLOCK_M,
        block_n=32 if q.dtype == torch.float32 else 64,  # the tiles' shared memory, as eager steps
        tiles=g.tiles,
        out=out,
        opts=opts,
    )
