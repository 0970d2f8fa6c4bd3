"""The base-2 online softmax step that every Triton attention kernel here runs per key tile.

`sm_scale * log2(e)` is folded into the logits (`LOG2E`), and partial results
keep a running max, sum and unnormalised output in float32; `normalized`
turns them into the output and its log2-sum-exp once the key loop is done.
The decode, extend and cascade kernels differ only in which queries form the
tile and which keys each row may see (`visible`).
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def attend_tile(
    q,
    K_head,
    V_head,
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
    DOT_PRECISION: tl.constexpr,
):
    """One key tile of the online softmax, shared by every kernel here: q `[M, D]` against
    the tile's keys (`slots` `[N]`, `n_mask` which exist) at `K_head` / `V_head` (the pool
    pointers offset to the KV head), `visible` `[M, N]` the logits a row may use. Returns
    the updated running max, sum and (unnormalised) output."""
    k = tl.load(
        K_head + slots[None, :] * stride_kn + offs_d[:, None],
        mask=n_mask[None, :] & d_mask[:, None],
        other=0.0,
    )
    qk = tl.dot(q, k, input_precision=DOT_PRECISION)
    qk = tl.where(visible, qk * sm_scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    # A row that sees nothing yet keeps -inf; keep its subtraction finite.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(qk - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    v = tl.load(
        V_head + slots[:, None] * stride_vn + offs_d[None, :],
        mask=n_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i * alpha + tl.sum(p, 1), acc


@triton.jit
def normalized(acc, l_i, m_i):
    """The output of a finished key loop and its log2-sum-exp (-inf where no key was seen)."""
    nonempty = l_i > 0.0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, m_i + tl.math.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    return out, lse
