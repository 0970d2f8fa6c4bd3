"""Triton attention kernels over the token-level slot layout.

Request b's context is `kv_indices[kv_indptr[b]:kv_indptr[b+1]]` (pool slots
in position order) and its new queries are rows `qo_indptr[b]:qo_indptr[b+1]`
of q; the K/V of those new tokens are already in the pool, so every key is
gathered through the slot table the same way. Every kernel runs the same
base-2 online softmax per key tile (`triton_softmax.attend_tile`).

This module holds the split-K decode kernel and the helpers the others share;
its partials' merge is in `triton_reduce`, the extend (prefill) kernel in
`triton_extend`, the cascade prefix level in `triton_cascade`. Importing either imports triton: only
`triton_backend` does, and only when the Triton backend is chosen.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixserve.runtime.attention.base import PLAIN_LAYER, LayerOptions
from radixserve.runtime.attention.tiling import DecodeTiling
from radixserve.runtime.attention.triton_reduce import new_partials, reduce_partials
from radixserve.runtime.attention.triton_softmax import (
    LOG2E,
    attend_tile,
    fp8_logit_scale,
    fp8_output,
    kv_args,
    layer_args,
    normalized,
)

__all__ = ["DecodeTiling", "decode_attention", "decode_partials", "new_partials", "reduce_partials"]


@triton.jit
def _decode_split_kernel(
    Q,
    K,
    V,
    kv_indptr,
    kv_indices,
    Skip,
    Out,
    Mid_O,
    Mid_LSE,
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
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    MID_SPLITS: tl.constexpr,
    HAS_SKIP: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr,
    F16_TILES: tl.constexpr,
):
    """One program: request b, KV head hk, split s of the context.

    The GROUP query heads that share hk are one [BLOCK_H, D] tile, so each
    K/V tile is read once per group and the logits are a matrix product.
    With MID_SPLITS == 0 the result goes straight to Out; otherwise the
    normalised partial output and its log2-sum-exp go to split s of the
    MID_SPLITS partials each (request, head) has in Mid_O / Mid_LSE (cascade
    steps put their shared-prefix partials after the NUM_SPLITS of this kernel, and
    this kernel's split 0 clears those slots to -inf first). With HAS_SKIP, request b's
    first `Skip[b]` context slots are left out (a cascade step's shared prefix). With
    HAS_WINDOW the query (the context's last position) sees its last `window` keys: the splits
    cut those alone, so older slots are never read. HAS_SOFTCAP, KV_FP8: see `attend_tile`;
    F16_TILES (with KV_FP8): q goes to float16, so the tiles upcast to float16.
    """
    sm_scale_log2 = fp8_logit_scale(sm_scale_log2, k_scale, KV_FP8)
    b = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.program_id(2)
    kv_start = tl.load(kv_indptr + b)
    kv_len = tl.load(kv_indptr + b + 1) - kv_start
    if HAS_SKIP:
        skip = tl.load(Skip + b)
        kv_start += skip
        kv_len -= skip
    first = 0
    if HAS_WINDOW:  # (never with HAS_SKIP: windowed models take no cascade steps)
        first = tl.maximum(kv_len - window, 0)
    split_len = tl.cdiv(kv_len - first, NUM_SPLITS)
    lo = first + s * split_len
    hi = tl.minimum(lo + split_len, kv_len)

    offs_g = tl.arange(0, BLOCK_H)
    offs_h = hk * GROUP + offs_g
    h_mask = offs_g < GROUP
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    q = tl.load(
        Q + b * stride_qt + offs_h[:, None] * stride_qh + offs_d[None, :],
        mask=h_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    if F16_TILES:  # float16's range: a larger |q| saturates rather than turning inf
        q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < hi
        slots = tl.load(kv_indices + kv_start + offs_n, mask=n_mask, other=0).to(tl.int64)
        m_i, l_i, acc = attend_tile(
            q,
            K + hk * stride_kh,
            V + hk * stride_vh,
            slots,
            n_mask,
            n_mask[None, :],
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

    out, lse = normalized(acc, l_i, m_i)
    out = fp8_output(out, v_scale, KV_FP8)
    store_mask = h_mask[:, None] & d_mask[None, :]
    if MID_SPLITS == 0:
        tl.store(
            Out + b * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :],
            out.to(Out.dtype.element_ty),
            mask=store_mask,
        )
    else:
        # Mid_O is [B, Hq, MID_SPLITS, BLOCK_D] and Mid_LSE [B, Hq, MID_SPLITS], contiguous.
        row = (b * (GROUP * tl.num_programs(1)) + offs_h) * MID_SPLITS + s
        # An empty split writes only its -inf log-sum-exp; the reduction skips its output.
        has_keys = (offs_g * 0 + lo) < hi  # per row (a vector: the mask must be a tensor)
        tl.store(Mid_O + row[:, None] * BLOCK_D + offs_d[None, :], out, mask=store_mask & has_keys[:, None])
        tl.store(Mid_LSE + row, lse, mask=h_mask)
        if s == 0:  # a cascade's level-0 slots, cleared once per (request, head)
            for j in tl.static_range(NUM_SPLITS, MID_SPLITS):
                tl.store(Mid_LSE + row + j, tl.full([BLOCK_H], float("-inf"), tl.float32), mask=h_mask)


def dot_precision(dtype: torch.dtype) -> str:
    # float32 inputs would otherwise be rounded to tf32 on the tensor cores
    # (~1e-3 relative); fp16/bf16 ignore the setting.
    return "ieee" if dtype == torch.float32 else "tf32"


def token_rows(cache: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's `(k, v)` pool buffers as `[slots, Hkv, D]`, given as such or as the
    page-size-1 views `[slots, 1, Hkv, D]` FlashInfer reads."""
    k, v = cache
    return k.view(k.shape[0], k.shape[-2], k.shape[-1]), v.view(v.shape[0], v.shape[-2], v.shape[-1])


def check_qkv(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor) -> torch.Tensor:
    if q.stride(-1) != 1:
        q = q.contiguous()
    assert k_pool.stride(-1) == 1 and v_pool.stride(-1) == 1, "pool rows must be contiguous"
    return q


def decode_attention(
    q: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    table: tuple[torch.Tensor, torch.Tensor],
    sm_scale: float,
    tiling: DecodeTiling,
    out: torch.Tensor | None = None,
    opts: LayerOptions = PLAIN_LAYER,
) -> torch.Tensor:
    """One new token per request: q `[B, Hq, D]` over the layer's pool buffers `kv`
    (`[S, Hkv, D]` each) through `table` (kv_indptr, kv_indices) -> `[B, Hq, D]`
    (`out`, when given), with the layer's window and soft-cap `opts`.

    The grid depends on the batch size and `tiling.splits` alone, so the
    launch is capturable in a CUDA graph.
    """
    q = check_qkv(q, *kv)
    out = torch.empty_like(q) if out is None else out
    mid = None if tiling.splits == 1 else new_partials(q, tiling.splits)
    _launch_decode(q, kv, table, sm_scale, tiling, out, mid, opts=opts)
    if mid is not None:
        reduce_partials(mid, out)
    return out


def decode_partials(
    q: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    table: tuple[torch.Tensor, torch.Tensor],
    sm_scale: float,
    tiling: DecodeTiling,
    mid: tuple[torch.Tensor, torch.Tensor],
    skip: torch.Tensor | None = None,
    opts: LayerOptions = PLAIN_LAYER,
) -> None:
    """The split kernel alone (`kv`: the layer's pool buffers, `table`: kv_indptr and
    kv_indices): request b's split s goes to partial s of `mid`; partials beyond the splits
    are set to -inf (log-sum-exp) for a cascade's level 0 to fill. `skip` (int32 [B]): slots
    at the start of each request's context to leave out. `opts`: the layer's (an FP8 pool's
    scales; cascade levels take no window or soft-cap)."""
    q = check_qkv(q, *kv)
    _launch_decode(q, kv, table, sm_scale, tiling, q, mid, skip, opts)


def _launch_decode(
    q: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    table: tuple[torch.Tensor, torch.Tensor],
    sm_scale: float,
    tiling: DecodeTiling,
    out: torch.Tensor,
    mid: tuple[torch.Tensor, torch.Tensor] | None,
    skip: torch.Tensor | None = None,
    opts: LayerOptions = PLAIN_LAYER,
) -> None:
    # A window counts back from the whole context's end, which skipping a prefix would move.
    assert skip is None or opts.window is None, "cascade levels take no window"
    k_pool, v_pool = kv
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_pool.shape[1]
    group = num_heads // num_kv_heads
    mid_o, mid_lse = mid if mid is not None else (out, out)  # unused by the kernel without partials
    _decode_split_kernel[(batch, num_kv_heads, tiling.splits)](
        q,
        k_pool,
        v_pool,
        table[0],
        table[1],
        table[0] if skip is None else skip,  # unused without HAS_SKIP
        out,
        mid_o,
        mid_lse,
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
        # tl.dot needs at least 16 rows: pad the group of query heads.
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_N=tiling.block_n,
        NUM_SPLITS=tiling.splits,
        MID_SPLITS=0 if mid is None else mid_lse.shape[2],
        HAS_SKIP=skip is not None,
        DOT_PRECISION=dot_precision(q.dtype),
        num_warps=tiling.num_warps,
        F16_TILES=tiling.fp8_f16 and opts.kv_scales is not None and q.dtype == torch.bfloat16,
        **({"num_stages": tiling.num_stages} if tiling.num_stages else {}),
        **layer_args(opts),
        **kv_args(opts),
    )
