"""The base-2 online softmax step that every Triton attention kernel here runs per key tile.

`sm_scale * log2(e)` is folded into the logits (`LOG2E`), and partial results
keep a running max, sum and unnormalised output in float32; `normalized`
turns them into the output and its log2-sum-exp once the key loop is done.
The decode, extend and cascade kernels differ only in which queries form the
tile and which keys each row may see (`visible`).

A layer's soft-cap (`LayerOptions.softcap`) is a `HAS_SOFTCAP` switch and its
window a `HAS_WINDOW` switch of each kernel (`layer_args`): constexprs, so a
model without them compiles the kernels it compiled before they existed. An FP8
pool is the `KV_FP8` switch: tiles upcast to q's dtype, K's scale folded into the
logits' (`fp8_logit_scale`), V's into the output (`fp8_output`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from radixserve.runtime.attention.base import LayerOptions

LOG2E = 1.4426950408889634
TWO_LOG2E = tl.constexpr(2 * LOG2E)


def kv_args(opts: LayerOptions) -> dict[str, float | bool]:
    """The FP8 pool arguments of a kernel launch: the layer's K and V scales and the `KV_FP8`
    switch (1.0 placeholders, unread, for a pool in the model dtype)."""
    k_scale, v_scale = opts.kv_scales if opts.kv_scales is not None else (1.0, 1.0)
    return {"k_scale": k_scale, "v_scale": v_scale, "KV_FP8": opts.kv_scales is not None}


def layer_args(opts: LayerOptions) -> dict[str, int | float | bool]:
    """The window / soft-cap arguments of a kernel launch (a kernel over an FP8 pool adds
    `kv_args`). The cap goes in the log2 domain the logits are in (`cap * log2(e)`); an unused
    value is a placeholder the switch leaves unread."""
    return {
        "window": opts.window if opts.window is not None else 0,
        "cap_log2": (opts.softcap if opts.softcap is not None else 1.0) * LOG2E,
        "HAS_WINDOW": opts.window is not None,
        "HAS_SOFTCAP": opts.softcap is not None,
    }


@triton.jit
def soft_capped(x, cap_log2):
    """`cap * tanh(s / cap)` of log2-domain logits (x = s * log2(e), cap_log2 = cap * log2(e)).
    tanh through exp2 (tl has no tanh in every version); saturates at +-cap_log2, never NaN."""
    e = tl.math.exp2(x * (TWO_LOG2E / cap_log2))
    return cap_log2 * (1.0 - 2.0 / (e + 1.0))


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
    cap_log2,
    m_i,
    l_i,
    acc,
    DOT_PRECISION: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    """One key tile of the online softmax, shared by every kernel here: q `[M, D]` against
    the tile's keys (`slots` `[N]`, `n_mask` which exist) at `K_head` / `V_head` (the pool
    pointers offset to the KV head), `visible` `[M, N]` the logits a row may use. Returns
    the updated running max, sum and (unnormalised) output. With HAS_SOFTCAP the scaled logits
    are soft-capped (`soft_capped`) before the mask, as transformers does. With KV_FP8 the
    tiles are upcast to q's dtype; their scales are the kernel's (`fp8_scales`, `fp8_output`)."""
    k = tl.load(
        K_head + slots[None, :] * stride_kn + offs_d[:, None],
        mask=n_mask[None, :] & d_mask[:, None],
        other=0.0,
    )
    if KV_FP8:
        k = k.to(q.dtype)
    qk = tl.dot(q, k, input_precision=DOT_PRECISION)
    qk = qk * sm_scale_log2
    if HAS_SOFTCAP:
        qk = soft_capped(qk, cap_log2)
    qk = tl.where(visible, qk, float("-inf"))
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
    if KV_FP8:
        v = v.to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i * alpha + tl.sum(p, 1), acc


@triton.jit
def fp8_logit_scale(sm_scale_log2, k_scale, KV_FP8: tl.constexpr):
    """The logits' scale: with an FP8 pool, K's scale folds into it (q.(s k) = s (q.k)), so
    K tiles are only upcast."""
    if KV_FP8:
        sm_scale_log2 = sm_scale_log2 * k_scale
    return sm_scale_log2


@triton.jit
def fp8_output(out, v_scale, KV_FP8: tl.constexpr):
    """A normalised output over FP8 V tiles times V's scale (softmax weights sum to one, so the
    scale factors out of every partial alike and merging partials keeps it)."""
    if KV_FP8:
        out = out * v_scale
    return out


@triton.jit
def normalized(acc, l_i, m_i):
    """The output of a finished key loop and its log2-sum-exp (-inf where no key was seen)."""
    nonempty = l_i > 0.0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, m_i + tl.math.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    return out, lse
